//! Every `keel` command line the README, `docs/` and `keel --help` (each command's help,
//! every flag's) show is one the command takes: shell blocks are parsed whole, and a command
//! quoted in prose must name real subcommands and flags. A renamed command or flag fails here
//! until the docs and the help say it the new way.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::Cli;

/// The README and every Markdown file under `docs/`.
fn documents() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("docs/ is readable") {
            let path = entry.expect("a docs entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                files.push(path);
            }
        }
    }
    files
}

/// A `keel` command line of a shell block, without its prompt, comment and what is piped
/// or chained after it (each `&&` part is a command line of its own).
fn shell_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut shell = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(fence) = trimmed.strip_prefix("```") {
            shell = !shell && matches!(fence.trim(), "sh" | "bash" | "shell" | "console");
            continue;
        }
        if !shell {
            continue;
        }
        let line = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        let line = line.split("  #").next().unwrap_or_default();
        for part in line.split("&&") {
            let part = part.split(['|', '>']).next().unwrap_or_default().trim();
            if part.starts_with("keel ") || part == "keel" {
                commands.push(part.to_owned());
            }
        }
    }
    commands
}

/// The commands quoted in prose: `keel ...` in backticks.
fn quoted_commands(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.starts_with("keel ") && !span.contains('\n'))
        .map(str::to_owned)
        .collect()
}

/// Why `words` (after `keel`) name no subcommand or flag of `command`, if they do not.
/// Placeholders (`TASK`, `[--deny]`, `bash|zsh`, `...`) are read as what they stand for.
fn check_names(command: &clap::Command, words: &[String]) -> Result<(), String> {
    let mut command = command;
    for word in words {
        let word = word.trim_matches(|c| c == '[' || c == ']');
        if let Some(flag) = word.strip_prefix("--") {
            let flag = flag.split('=').next().unwrap_or_default();
            let known = flag == "help"
                || command
                    .get_arguments()
                    .any(|arg| arg.get_long() == Some(flag));
            if !known {
                return Err(format!("`{}` has no flag --{flag}", command.get_name()));
            }
        } else if let Some(sub) = command.find_subcommand(word.split('|').next().unwrap_or(word)) {
            command = sub;
        } else if command.has_subcommands() && command.get_positionals().next().is_none() {
            return Err(format!(
                "`{}` has no subcommand `{word}`",
                command.get_name()
            ));
        } else {
            // A value or a placeholder: the rest are flags of this command or values.
        }
    }
    Ok(())
}

#[test]
fn every_command_line_the_docs_show_is_one_keel_takes() {
    let cli = Cli::command();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for file in documents() {
        let text = std::fs::read_to_string(&file).expect("a readable doc");
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for line in shell_commands(&text) {
            seen += 1;
            let words = shlex::split(&line).unwrap_or_default();
            if let Err(err) = cli.clone().try_get_matches_from(&words) {
                wrong.push(format!("{name}: `{line}`: {}", err.kind()));
            }
        }
        for span in quoted_commands(&text) {
            seen += 1;
            let words: Vec<String> = span.split_whitespace().skip(1).map(str::to_owned).collect();
            if let Err(err) = check_names(&cli, &words) {
                wrong.push(format!("{name}: `{span}`: {err}"));
            }
        }
    }
    assert!(
        seen > 40,
        "the docs show {seen} command lines: is the extraction broken?"
    );
    assert!(
        wrong.is_empty(),
        "command lines the docs show that keel does not take:\n{}",
        wrong.join("\n")
    );
}

/// The help texts of `command` and of everything under it, each with the command it belongs
/// to: each command's about (short and long) and each of its arguments' help, as `keel ...
/// --help` prints them.
fn help_texts(command: &clap::Command) -> Vec<(&clap::Command, String)> {
    let abouts = [command.get_about(), command.get_long_about()];
    let args = command
        .get_arguments()
        .flat_map(|arg| [arg.get_help(), arg.get_long_help()]);
    let mut texts: Vec<_> = abouts
        .into_iter()
        .chain(args)
        .flatten()
        .map(|text| (command, text.to_string()))
        .collect();
    // `keel help ...` (clap's own, made by `build`) repeats the abouts without the flags.
    for sub in command
        .get_subcommands()
        .filter(|sub| sub.get_name() != "help")
    {
        texts.extend(help_texts(sub));
    }
    texts
}

/// The `--flags` a help text names outside the `keel ...` command lines it quotes (those name
/// another command's flags and are checked whole).
fn flags_named(text: &str) -> Vec<String> {
    let prose: String = text
        .split('`')
        .enumerate()
        .filter(|(i, span)| i % 2 == 0 || !span.starts_with("keel "))
        .map(|(_, span)| format!("{span} "))
        .collect();
    prose
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter_map(|word| word.strip_prefix("--"))
        .filter(|flag| flag.starts_with(|c: char| c.is_ascii_lowercase()))
        .map(|flag| flag.trim_end_matches('-').to_owned())
        .collect()
}

#[test]
fn every_command_line_and_flag_the_help_shows_is_one_keel_takes() {
    let mut cli = Cli::command();
    // Global flags (`--verbose`) reach every subcommand, as they do on the command line.
    cli.build();
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (command, text) in help_texts(&cli) {
        let name = command.get_name();
        for span in quoted_commands(&text) {
            seen += 1;
            let words: Vec<String> = span.split_whitespace().skip(1).map(str::to_owned).collect();
            if let Err(err) = check_names(&cli, &words) {
                wrong.push(format!("help of `{name}`: `{span}`: {err}"));
            }
        }
        for flag in flags_named(&text) {
            seen += 1;
            let known = command
                .get_arguments()
                .any(|arg| arg.get_long() == Some(flag.as_str()));
            if !known {
                wrong.push(format!(
                    "help of `{name}` names --{flag}, a flag it does not have"
                ));
            }
        }
    }
    // The top-level help names the tasks commands as they are spelled (it once advertised a
    // `tasks follow` that was `subscribe`).
    let top = cli.clone().render_long_help().to_string();
    let tasks = cli.find_subcommand("tasks").expect("keel tasks");
    for word in ["list", "get", "cancel", "subscribe", "approve"] {
        assert!(tasks.find_subcommand(word).is_some(), "keel tasks {word}");
        assert!(
            top.contains(word),
            "`keel --help` should name `tasks {word}`:\n{top}"
        );
    }
    assert!(!top.contains("follow"), "{top}");
    assert!(
        seen > 40,
        "the help shows {seen} command lines and flags: is the extraction broken?"
    );
    assert!(
        wrong.is_empty(),
        "command lines and flags the help shows that keel does not take:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_misspelled_command_or_flag_is_caught() {
    let cli = Cli::command();
    let words = |line: &str| {
        line.split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(check_names(&cli, &words("tasks follow ID")).is_err());
    assert!(check_names(&cli, &words("tasks approve TASK --req R")).is_err());
    assert!(check_names(&cli, &words("tasks approve TASK [--deny]")).is_ok());
    assert_eq!(
        shell_commands("```sh\n$ keel init && keel check   # ok\n```\n"),
        ["keel init", "keel check"]
    );
    assert_eq!(
        flags_named("over --max-tokens (or `--deny`, not `keel run --url`); --1"),
        ["max-tokens", "deny"]
    );
}
