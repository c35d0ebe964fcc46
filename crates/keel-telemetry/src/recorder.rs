//! The process's `metrics` over OTLP: a `metrics` recorder that records every counter, gauge
//! and histogram the engine and the server count onto OpenTelemetry instruments of the same
//! names and labels, exported by a periodic reader (decision 233). It sits beside the
//! Prometheus recorder (a fan-out) when `/metrics` is served too, so both show one set.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_sdk::metrics::SdkMeterProvider;

/// A `metrics` recorder over an OpenTelemetry meter ([`crate::Telemetry::recorder`]).
#[derive(Clone)]
pub struct OtlpRecorder {
    meter: Meter,
    /// The buckets of histograms whose name ends in `_seconds` (the SDK's default buckets
    /// are for milliseconds).
    seconds_buckets: Option<Vec<f64>>,
    /// A gauge's current value per series: `metrics` gauges move up and down, OpenTelemetry
    /// gauges are set, so the value is kept here and each move sets it.
    gauges: Arc<Mutex<HashMap<Key, Arc<GaugeState>>>>,
}

impl std::fmt::Debug for OtlpRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpRecorder").finish_non_exhaustive()
    }
}

impl OtlpRecorder {
    pub(crate) fn new(provider: &SdkMeterProvider) -> Self {
        Self {
            meter: provider.meter("keel"),
            seconds_buckets: None,
            gauges: Arc::default(),
        }
    }

    /// Histograms named `..._seconds` use these bucket boundaries, as the Prometheus
    /// recorder beside this one does.
    pub fn with_seconds_buckets(mut self, buckets: &[f64]) -> Self {
        self.seconds_buckets = Some(buckets.to_vec());
        self
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|label| KeyValue::new(label.key().to_owned(), label.value().to_owned()))
        .collect()
}

struct OtlpCounter {
    counter: opentelemetry::metrics::Counter<u64>,
    attributes: Vec<KeyValue>,
}

impl CounterFn for OtlpCounter {
    fn increment(&self, value: u64) {
        self.counter.add(value, &self.attributes);
    }

    // An OpenTelemetry counter only adds: Keel's counters never set an absolute value.
    fn absolute(&self, _value: u64) {}
}

struct GaugeState {
    gauge: opentelemetry::metrics::Gauge<f64>,
    attributes: Vec<KeyValue>,
    /// The value's bits (`f64::to_bits`).
    value: AtomicU64,
}

impl GaugeState {
    fn update(&self, change: impl Fn(f64) -> f64) {
        let mut new = 0.0;
        let _ = self
            .value
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                new = change(f64::from_bits(bits));
                Some(new.to_bits())
            });
        self.gauge.record(new, &self.attributes);
    }
}

impl GaugeFn for GaugeState {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

struct OtlpHistogram {
    histogram: opentelemetry::metrics::Histogram<f64>,
    attributes: Vec<KeyValue>,
}

impl HistogramFn for OtlpHistogram {
    fn record(&self, value: f64) {
        self.histogram.record(value, &self.attributes);
    }
}

impl Recorder for OtlpRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    // The SDK keeps one instrument per name: building it again on each registration finds it.
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let counter = self.meter.u64_counter(key.name().to_owned()).build();
        Counter::from_arc(Arc::new(OtlpCounter {
            counter,
            attributes: attributes(key),
        }))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap_or_else(|e| e.into_inner());
        let state = gauges.entry(key.clone()).or_insert_with(|| {
            Arc::new(GaugeState {
                gauge: self.meter.f64_gauge(key.name().to_owned()).build(),
                attributes: attributes(key),
                value: AtomicU64::new(0.0f64.to_bits()),
            })
        });
        Gauge::from_arc(state.clone())
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut builder = self.meter.f64_histogram(key.name().to_owned());
        if let Some(buckets) = self
            .seconds_buckets
            .as_ref()
            .filter(|_| key.name().ends_with("_seconds"))
        {
            builder = builder.with_boundaries(buckets.clone());
        }
        Histogram::from_arc(Arc::new(OtlpHistogram {
            histogram: builder.build(),
            attributes: attributes(key),
        }))
    }
}
