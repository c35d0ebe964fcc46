// Runs once per isolate, before any caller code. It captures the intrinsics the runtime
// needs (so later tampering by sandboxed code cannot redirect them), locks down code
// generation from strings, removes non-standard and shared-memory globals, and returns
// the runtime's private helpers. It declares no bindings: it is one function expression.
(function keelSetup(hostCall, consoleWrite) {
  'use strict';
  const G = globalThis;
  const { apply, getPrototypeOf, ownKeys } = Reflect;
  const { freeze, isFrozen, keys, defineProperty, getOwnPropertyDescriptor } = Object;
  const getter = (proto, name) => getOwnPropertyDescriptor(proto, name).get;
  const ObjectProto = Object.prototype;
  const ArrayCtor = Array;
  const isArray = Array.isArray;
  const DateCtor = Date;
  const MapCtor = Map;
  const SetCtor = Set;
  const PromiseCtor = Promise;
  const U8 = Uint8Array;
  const BigIntFn = BigInt;
  const StringFn = String;
  const ErrorCtor = Error;
  const isError = Error.isError;
  const stringify = JSON.stringify;
  const getTime = Date.prototype.getTime;
  const mapSize = getter(Map.prototype, 'size');
  const setSize = getter(Set.prototype, 'size');
  const { forEach: mapForEach, set: mapSet, get: mapGet, delete: mapDelete } = Map.prototype;
  const { forEach: setForEach, add: setAdd } = Set.prototype;
  const TypedArrayProto = getPrototypeOf(Uint8Array.prototype);
  const taTag = getter(TypedArrayProto, Symbol.toStringTag);
  const taBuffer = getter(TypedArrayProto, 'buffer');
  const taOffset = getter(TypedArrayProto, 'byteOffset');
  const taLength = getter(TypedArrayProto, 'byteLength');
  const abLength = getter(ArrayBuffer.prototype, 'byteLength');
  const dvLength = getter(DataView.prototype, 'byteLength');
  const regexpSource = getter(RegExp.prototype, 'source');
  const weakMapHas = WeakMap.prototype.has;
  const weakSetHas = WeakSet.prototype.has;
  const weakRefDeref = WeakRef.prototype.deref;
  const symbolToString = Symbol.prototype.toString;
  const typedCtors = {
    Int8Array, Uint8Array, Uint8ClampedArray, Int16Array, Uint16Array, Int32Array,
    Uint32Array, Float32Array, Float64Array, BigInt64Array, BigUint64Array,
  };

  const brand = (fn, v, args) => {
    try { apply(fn, v, args || []); return true; } catch { return false; }
  };

  // --- lockdown -----------------------------------------------------------------------
  const blockedMessage = 'code generation from strings is disallowed in the sandbox';
  const blockedCtor = (original) => {
    const blocked = function Function() { throw new EvalError(blockedMessage); };
    defineProperty(blocked, 'prototype', { value: original.prototype });
    defineProperty(original.prototype, 'constructor', {
      value: blocked, writable: false, enumerable: false, configurable: false,
    });
    return blocked;
  };
  const blockedFunction = blockedCtor(Function);
  blockedCtor(getPrototypeOf(async function () {}).constructor);
  blockedCtor(getPrototypeOf(function* () {}).constructor);
  blockedCtor(getPrototypeOf(async function* () {}).constructor);
  defineProperty(G, 'Function', {
    value: blockedFunction, writable: true, enumerable: false, configurable: true,
  });
  defineProperty(G, 'eval', {
    value: { eval() { throw new EvalError(blockedMessage); } }.eval,
    writable: true, enumerable: false, configurable: true,
  });
  // V8's stack hook would hand sandboxed code the functions on the stack (the runtime's
  // own bridges among them): pin it to undefined.
  defineProperty(ErrorCtor, 'prepareStackTrace', {
    value: undefined, writable: false, enumerable: false, configurable: false,
  });
  for (const name of ['SharedArrayBuffer', 'Atomics', 'InternalError']) {
    delete G[name];
  }

  // --- structured clone: sandbox -> host ----------------------------------------------
  // Classifies a non-array, non-function object for the Rust marshaller.
  const classify = (v) => {
    if (brand(getTime, v)) return 'date';
    if (brand(mapSize, v)) return 'map';
    if (brand(setSize, v)) return 'set';
    if (apply(taTag, v, []) !== undefined) return 'typed';
    if (brand(abLength, v)) return 'arraybuffer';
    if (brand(dvLength, v)) return 'dataview';
    if (brand(weakMapHas, v, [ObjectProto]) || brand(weakSetHas, v, [ObjectProto])) return 'weak';
    if (brand(weakRefDeref, v)) return 'weak';
    if (brand(regexpSource, v)) return 'regexp';
    if (isError(v)) return 'error';
    const proto = getPrototypeOf(v);
    if (proto === ObjectProto || proto === null) return 'object';
    return 'class';
  };
  const entries = (m) => {
    const out = [];
    apply(mapForEach, m, [(value, key) => { out[out.length] = [key, value]; }]);
    return out;
  };
  const values = (s) => {
    const out = [];
    apply(setForEach, s, [(value) => { out[out.length] = value; }]);
    return out;
  };
  const typedBytes = (v) => [
    apply(taTag, v, []),
    new U8(apply(taBuffer, v, []), apply(taOffset, v, []), apply(taLength, v, [])),
  ];
  const bufferBytes = (v) => new U8(v);
  const dateValue = (d) => apply(getTime, d, []);

  // --- structured clone: host -> sandbox ----------------------------------------------
  const makeDate = (ms) => new DateCtor(ms);
  const makeMap = (pairs) => {
    const m = new MapCtor();
    for (let i = 0; i < pairs.length; i++) apply(mapSet, m, [pairs[i][0], pairs[i][1]]);
    return m;
  };
  const makeSet = (items) => {
    const s = new SetCtor();
    for (let i = 0; i < items.length; i++) apply(setAdd, s, [items[i]]);
    return s;
  };
  const makeTyped = (name, bytes) => {
    const Ctor = typedCtors[name];
    return new Ctor(apply(taBuffer, bytes, []), 0, bytes.length / Ctor.BYTES_PER_ELEMENT);
  };
  const makeBuffer = (bytes) => apply(taBuffer, bytes, []);
  const makeBigInt = (digits) => BigIntFn(digits);
  const makeError = (name, message) => {
    const e = new ErrorCtor(message);
    defineProperty(e, 'name', { value: name, writable: true, enumerable: false, configurable: true });
    return e;
  };
  const deepFreeze = (v) => {
    if ((typeof v === 'object' && v !== null) || typeof v === 'function') {
      if (isFrozen(v)) return v;
      freeze(v);
      const ks = ownKeys(v);
      for (let i = 0; i < ks.length; i++) {
        const d = getOwnPropertyDescriptor(v, ks[i]);
        if (d && 'value' in d) deepFreeze(d.value);
      }
    }
    return v;
  };

  // --- host functions as callable proxies ---------------------------------------------
  const pending = new MapCtor();
  let nextId = 0;
  let H;
  const makeProxy = (index, name) => {
    const holder = {
      [name](...args) {
        return new PromiseCtor((resolve, reject) => {
          const id = ++nextId;
          apply(mapSet, pending, [id, [resolve, reject]]);
          try {
            hostCall(index, id, args, H);
          } catch (e) {
            apply(mapDelete, pending, [id]);
            reject(e);
          }
        });
      },
    };
    return freeze(holder[name]);
  };
  const settle = (id, ok, value) => {
    const r = apply(mapGet, pending, [id]);
    if (r === undefined) return;
    apply(mapDelete, pending, [id]);
    (ok ? r[0] : r[1])(value);
  };

  // --- console capture ----------------------------------------------------------------
  const format = (v) => {
    try {
      switch (typeof v) {
        case 'string': return v;
        case 'bigint': return StringFn(v) + 'n';
        case 'symbol': return apply(symbolToString, v, []);
        case 'undefined': return 'undefined';
        case 'function': return '[Function ' + (v.name || 'anonymous') + ']';
        case 'object': {
          if (v === null) return 'null';
          if (isError(v)) return StringFn(v.name) + ': ' + StringFn(v.message);
          const s = stringify(v, (k, x) => (typeof x === 'bigint' ? StringFn(x) + 'n' : x));
          return s === undefined ? StringFn(v) : s;
        }
        default: return StringFn(v);
      }
    } catch {
      try { return StringFn(v); } catch { return '[unprintable]'; }
    }
  };
  const line = (level) => function (...args) {
    let text = '';
    for (let i = 0; i < args.length; i++) text += (i ? ' ' : '') + format(args[i]);
    consoleWrite(level, text);
  };
  const consoleObject = freeze({
    log: line('log'), info: line('info'), warn: line('warn'), error: line('error'),
    debug: line('debug'), trace: line('debug'),
  });

  H = freeze({
    classify, entries, values, typedBytes, bufferBytes, dateValue, keys, isArray,
    makeDate, makeMap, makeSet, makeTyped, makeBuffer, makeBigInt, makeError, deepFreeze,
    makeProxy, settle, format, console: consoleObject,
    newObject: () => ({}), newArray: () => new ArrayCtor(),
  });
  return H;
})
