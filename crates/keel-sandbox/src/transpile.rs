//! Source preparation: TypeScript type erasure (§13.6) and the facts the isolate needs.
//!
//! Every source module is parsed by oxc, which reports syntax errors with positions in the
//! caller's source and names the module's top-level bindings (so that a caller-supplied
//! global never collides with a declaration of the same name). No type checker ever runs.
//!
//! A TypeScript module, its types are removed by
//! `oxc_transformer` with every syntax-lowering pass off (the output is still ESNext, which
//! QuickJS runs as is), and printed by `oxc_codegen` with a source map. The source map is
//! kept as a small position table so that errors raised by the engine in the erased code
//! can be reported at the line and column of the caller's source.

use std::collections::HashSet;
use std::path::Path;

use oxc_allocator::Allocator;
use oxc_codegen::{Codegen, CodegenOptions};
use oxc_parser::Parser;
use oxc_semantic::SemanticBuilder;
use oxc_span::SourceType;
use oxc_transformer::{TransformOptions, Transformer};

/// JavaScript ready to evaluate, with the way back to the original positions.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// The JavaScript to evaluate.
    pub code: String,
    /// Maps positions in `code` back to the caller's source.
    pub positions: PositionMap,
    /// Names the module declares at its top level (imports included).
    pub top_level: HashSet<String>,
}

/// A syntax error found while erasing types, at a position in the caller's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EraseError {
    /// What the parser or transformer said.
    pub message: String,
    /// 1-based line, when the diagnostic points somewhere.
    pub line: Option<u32>,
    /// 1-based column, when the diagnostic points somewhere.
    pub column: Option<u32>,
}

/// Generated-to-original positions, as `(generated line, generated column, original line,
/// original column)`, all 0-based, sorted by generated position.
#[derive(Debug, Default, Clone)]
pub(crate) struct PositionMap {
    tokens: Vec<(u32, u32, u32, u32)>,
    identity: bool,
}

impl PositionMap {
    /// A map for code that was not transformed: every position maps to itself.
    pub fn identity() -> Self {
        Self {
            tokens: Vec::new(),
            identity: true,
        }
    }

    /// The original 1-based `(line, column)` of a 1-based generated position.
    pub fn original(&self, line: u32, column: u32) -> (u32, u32) {
        if self.identity || line == 0 {
            return (line, column);
        }
        let (gl, gc) = (line - 1, column.saturating_sub(1));
        let idx = self.tokens.partition_point(|t| (t.0, t.1) <= (gl, gc));
        let Some(&(tl, tc, sl, sc)) = idx.checked_sub(1).and_then(|i| self.tokens.get(i)) else {
            return (line, column);
        };
        if tl == gl {
            (sl + 1, sc + (gc - tc) + 1)
        } else {
            (sl + 1, sc + 1)
        }
    }
}

/// Parses a module and, when `typescript`, strips its types.
pub(crate) fn prepare(
    source: &str,
    filename: &str,
    typescript: bool,
) -> Result<Prepared, EraseError> {
    let allocator = Allocator::default();
    let source_type = if typescript {
        SourceType::ts().with_module(true)
    } else {
        SourceType::mjs()
    };
    let parsed = Parser::new(&allocator, source, source_type).parse();
    if let Some(first) = parsed.diagnostics.errors().next() {
        return Err(diagnostic_error(source, first));
    }
    if parsed.panicked {
        return Err(EraseError {
            message: "could not parse the source".to_owned(),
            line: None,
            column: None,
        });
    }
    let mut program = parsed.program;
    let semantic = SemanticBuilder::new().with_enum_eval(true).build(&program);
    let scoping = semantic.semantic.into_scoping();
    let top_level: HashSet<String> = scoping
        .iter_bindings_in(scoping.root_scope_id())
        .map(|symbol| scoping.symbol_name(symbol).to_owned())
        .collect();
    if !typescript {
        return Ok(Prepared {
            code: source.to_owned(),
            positions: PositionMap::identity(),
            top_level,
        });
    }
    let path = Path::new(filename);
    let options = TransformOptions::default();
    let transformed =
        Transformer::new(&allocator, path, &options).build_with_scoping(scoping, &mut program);
    if let Some(first) = transformed.diagnostics.errors().next() {
        return Err(diagnostic_error(source, first));
    }
    let printed = Codegen::new()
        .with_options(CodegenOptions {
            source_map_path: Some(path.to_path_buf()),
            ..CodegenOptions::default()
        })
        .build(&program);
    let mut tokens: Vec<(u32, u32, u32, u32)> = printed
        .map
        .as_ref()
        .map(|map| {
            map.get_tokens()
                .map(|t| {
                    (
                        t.get_dst_line(),
                        t.get_dst_col(),
                        t.get_src_line(),
                        t.get_src_col(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    tokens.sort_unstable();
    Ok(Prepared {
        code: printed.code,
        positions: PositionMap {
            tokens,
            identity: false,
        },
        top_level,
    })
}

fn diagnostic_error(source: &str, diagnostic: &oxc_diagnostics::OxcDiagnostic) -> EraseError {
    let offset = diagnostic.labels.first().map(|label| label.offset());
    let (line, column) = match offset {
        Some(offset) => {
            let (l, c) = line_column(source, offset as usize);
            (Some(l), Some(c))
        }
        None => (None, None),
    };
    EraseError {
        message: diagnostic.message.to_string(),
        line,
        column,
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(source: &str, offset: usize) -> (u32, u32) {
    let offset = offset.min(source.len());
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before.get(line_start..).map_or(0, |s| s.chars().count()) + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(column).unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_annotations_interfaces_and_generics() {
        let src = "interface P { x: number }\nconst p: P = { x: 1 };\nfunction id<T>(v: T): T { return v as T; }\nexport default id<number>(p.x!);\n";
        let out = prepare(src, "main.ts", true).expect("erases");
        assert!(!out.code.contains("interface"), "{}", out.code);
        assert!(!out.code.contains(": number"), "{}", out.code);
        assert!(out.code.contains("export default"), "{}", out.code);
    }

    #[test]
    fn enums_become_javascript() {
        let out = prepare(
            "enum Color { Red, Green }\nexport default Color.Green;",
            "main.ts",
            true,
        )
        .expect("erases");
        assert!(out.code.contains("Color"), "{}", out.code);
    }

    #[test]
    fn syntax_error_points_into_the_callers_source() {
        let err = prepare("const a = 1;\nconst b: = 2;\n", "main.ts", true).expect_err("fails");
        assert_eq!(err.line, Some(2));
        assert!(err.column.is_some());
    }

    #[test]
    fn positions_map_back_across_removed_lines() {
        let src = "type A = string;\ninterface B {\n  y: A;\n}\nthrow new Error('x');\n";
        let out = prepare(src, "main.ts", true).expect("erases");
        let gen_line = out
            .code
            .lines()
            .position(|l| l.contains("throw"))
            .expect("throw kept");
        let line = u32::try_from(gen_line + 1).expect("small");
        assert_eq!(out.positions.original(line, 1).0, 5);
    }

    #[test]
    fn top_level_names_are_reported() {
        let out = prepare(
            "import x from 'y';\nconst console = 1;\nfunction f() { let inner = 2; }",
            "m.js",
            false,
        )
        .expect("parses");
        assert!(out.top_level.contains("console") && out.top_level.contains("x"));
        assert!(!out.top_level.contains("inner"));
    }

    #[test]
    fn line_column_counts_from_one() {
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("", 10), (1, 1));
    }
}
