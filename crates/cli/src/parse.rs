//! The command line into a [`Cli`]. clap's derived tree holds every command with all of
//! its options, and a fresh process took 0.8-1.1 ms to build it (with a copy of each
//! global option in every command) and parse against it: 6-9% of an unchanged backup of
//! the mixed corpus. So the words are first parsed against a small tree, the global
//! options and the one command they name, built by the same derived code; only if that
//! fails (a request for help or the version, a mistake, a command with subcommands of its
//! own) are they parsed against the whole tree, so every message is the whole tree's.
//!
//! Where the small tree parses the words into the command it was built for, the whole
//! tree parses them the same way: the root takes no positional arguments, so the words
//! before the command's name are global options or their values in both, and the
//! command's own tree is the same in both.

use std::ffi::OsString;

use clap::{Args, Command as ClapCommand, CommandFactory, FromArgMatches};

use crate::args::*;

/// Parses the command line, as `Parser::parse` does, and exits with clap's message where
/// it does not parse (or asks for help or the version).
pub fn command_line() -> Cli {
    let words: Vec<OsString> = std::env::args_os().collect();
    parse(&words).unwrap_or_else(|e| usage_error(e, &words))
}

/// Parses `words` (the program's name first), and then forgets the password options of
/// `config repo add` that were not typed: clap hands them the values of
/// `CAIRN_PASSWORD_FILE`/`CAIRN_PASSWORD_COMMAND` through the global options of the same
/// names, and a password source meant for `-r` must not be written into the config file.
fn parse(words: &[OsString]) -> Result<Cli, clap::Error> {
    let matches = match small_tree_matches(words) {
        Some(matches) => matches,
        None => whole_tree().try_get_matches_from(words)?,
    };
    // Not `from_arg_matches_mut`, which takes the values (and their sources) out.
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let Command::Config(ConfigCommand::Repo(RepoCommand::Add(add))) = &mut cli.command {
        let add_matches = ["config", "repo", "add"]
            .iter()
            .try_fold(&matches, |m, name| m.subcommand_matches(name));
        let typed = |id: &str| {
            add_matches.and_then(|m| m.value_source(id))
                == Some(clap::parser::ValueSource::CommandLine)
        };
        if !typed("password_command") {
            add.password_command = None;
        }
        if !typed("password_file") {
            add.password_file = None;
        }
    }
    Ok(cli)
}

/// Every command, each with the environment and exit codes after its help.
fn whole_tree() -> ClapCommand {
    Cli::command().mut_subcommands(|c| c.after_help(AFTER_HELP))
}

/// `words` parsed against the global options and the command they name, if that parses.
fn small_tree_matches(words: &[OsString]) -> Option<clap::ArgMatches> {
    let root = GlobalArgs::augment_args(ClapCommand::new("cairn"));
    let name = named_command(&root, words)?;
    let matches = root
        .subcommand(one_command(name)?)
        .try_get_matches_from(words)
        .ok()?;
    // Where the guess took an option's value for the command (`-qr backup`), the words
    // may parse without one, which the whole tree refuses.
    (matches.subcommand_name() == Some(name)).then_some(matches)
}

/// The first word that is neither an option nor the value of a global option before it.
/// A wrong guess (`-qr REPO`, whose value this takes for the command) costs only time:
/// the small tree then does not parse the words into that command.
fn named_command<'a>(root: &ClapCommand, words: &'a [OsString]) -> Option<&'a str> {
    let takes_value = |word: &str| {
        root.get_arguments()
            .filter(|a| a.get_action().takes_values())
            .any(|a| match word.strip_prefix("--") {
                Some(long) => a.get_long() == Some(long),
                None => word.len() == 2 && a.get_short().is_some_and(|s| word.ends_with(s)),
            })
    };
    let mut rest = words.iter().skip(1);
    while let Some(word) = rest.next() {
        let word = word.to_str()?;
        if !word.starts_with('-') {
            return Some(word);
        }
        if takes_value(word) {
            rest.next();
        }
    }
    None
}

/// The command `name` with its options, as the derived tree has it, for the commands
/// without subcommands of their own (their variants carry nothing but the arguments).
fn one_command(name: &str) -> Option<ClapCommand> {
    fn with<A: Args>(name: &'static str) -> ClapCommand {
        A::augment_args(ClapCommand::new(name))
    }
    Some(match name {
        "init" => with::<InitArgs>("init"),
        "backup" => with::<BackupArgs>("backup"),
        "snapshots" => with::<SnapshotsArgs>("snapshots"),
        "ls" => with::<LsArgs>("ls"),
        "cat" => with::<CatArgs>("cat"),
        "dump" => with::<DumpArgs>("dump"),
        "mount" => with::<MountArgs>("mount"),
        "restore" => with::<RestoreArgs>("restore"),
        "diff" => with::<DiffArgs>("diff"),
        "find" => with::<FindArgs>("find"),
        "stats" => with::<StatsArgs>("stats"),
        "chunk" => with::<ChunkArgs>("chunk"),
        "check" => with::<CheckArgs>("check"),
        "forget" => with::<ForgetArgs>("forget"),
        "tag" => with::<TagArgs>("tag"),
        "rewrite" => with::<RewriteArgs>("rewrite"),
        "prune" => with::<PruneArgs>("prune"),
        "copy" => with::<CopyArgs>("copy"),
        "serve" => with::<ServeArgs>("serve"),
        "generate" => with::<GenerateArgs>("generate"),
        "run" => with::<RunArgs>("run"),
        "daemon" => with::<DaemonArgs>("daemon"),
        _ => return None,
    })
}

/// Exits on a command line clap rejects (or on `--help`/`--version`, which it reports as
/// errors). The command line did not parse, so `--json` is looked for among `words`
/// (the program's name first) before a `--`: with it, the error is also one JSON
/// document on stdout.
fn usage_error(e: clap::Error, words: &[OsString]) -> ! {
    use clap::error::ErrorKind;
    let json = words
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "--json");
    let asked = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
    if json && !asked {
        let text = e.to_string();
        let message = text.trim().strip_prefix("error: ").unwrap_or(text.trim());
        crate::output::json_error("usage", message, e.exit_code() as u8);
    }
    e.exit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &[&str]) -> Vec<OsString> {
        std::iter::once("cairn")
            .chain(line.iter().copied())
            .map(OsString::from)
            .collect()
    }

    /// Each small tree's command is the whole tree's but for its description (the
    /// variant's doc comment) and place in the list of commands, which only help shows:
    /// the same arguments, groups, settings and subcommands. Every command of the whole
    /// tree has one but those with subcommands of their own.
    #[test]
    fn each_small_command_is_the_whole_trees() {
        let whole = Cli::command();
        for command in whole.get_subcommands() {
            let name = command.get_name();
            let Some(small) = one_command(name) else {
                assert!(
                    command.has_subcommands() && command.get_arguments().next().is_none(),
                    "{name} has no small tree"
                );
                continue;
            };
            let shown = |c: &ClapCommand| {
                let c = c.clone().about(None).long_about(None).display_order(0);
                format!("{c:?}")
            };
            assert_eq!(shown(&small), shown(command), "{name}");
        }
    }

    /// Command lines that the small tree parses give what the whole tree gives.
    #[test]
    fn the_small_tree_parses_as_the_whole_one() {
        let lines: &[&[&str]] = &[
            &["backup", "-q", "/src"],
            &[
                "-r",
                "/repo",
                "backup",
                "--exclude",
                "*.o",
                "--tag",
                "a,b",
                "/x",
                "/y",
            ],
            &["--repo=/repo", "-q", "backup", "--json", "/x"],
            // A repository named like a command.
            &["-r", "backup", "snapshots", "--json"],
            &[
                "--password-file",
                "restore",
                "restore",
                "latest",
                "--target",
                "/t",
            ],
            &[
                "restore",
                "latest",
                "--target",
                "/t",
                "--include",
                "/a/b",
                "--verify",
            ],
            &["forget", "--keep-last", "3", "--keep-daily", "7", "--prune"],
            &[
                "check",
                "--read-data-subset",
                "1/5",
                "--limit-download",
                "100",
            ],
            &["serve", "--dir", "/srv", "scrub", "r1"],
            &["ls", "latest", "/a", "-r", "/repo", "--nice"],
        ];
        for line in lines {
            let words = words(line);
            assert!(small_tree_matches(&words).is_some(), "{line:?}");
            let small = parse(&words).unwrap();
            let whole =
                Cli::from_arg_matches(&whole_tree().try_get_matches_from(&words).unwrap()).unwrap();
            assert_eq!(format!("{small:?}"), format!("{whole:?}"), "{line:?}");
        }
    }

    /// A file name that is not UTF-8 (any bytes but `/` and NUL, here with an option's
    /// look) parses as the whole tree parses it, as a command's argument or a global
    /// option's value; a word before the command that is neither goes to the whole tree.
    #[test]
    fn names_that_are_not_utf8_parse_as_in_the_whole_tree() {
        use std::os::unix::ffi::OsStringExt;
        let odd = || OsString::from_vec(b"/src/\xff\xfe-r \n--json".to_vec());
        let whole = |words: &[OsString]| {
            let matches = whole_tree().try_get_matches_from(words).unwrap();
            format!("{:?}", Cli::from_arg_matches(&matches).unwrap())
        };
        for words in [
            vec!["cairn".into(), "backup".into(), "-q".into(), odd()],
            vec![
                "cairn".into(),
                "--cache-dir".into(),
                odd(),
                "snapshots".into(),
            ],
        ] {
            assert!(small_tree_matches(&words).is_some(), "{words:?}");
            assert_eq!(format!("{:?}", parse(&words).unwrap()), whole(&words));
        }
        let stray = vec!["cairn".into(), odd(), "snapshots".into()];
        assert!(small_tree_matches(&stray).is_none());
        assert!(parse(&stray).is_err());
    }

    /// Help, the version, mistakes and commands with subcommands go to the whole tree,
    /// whose messages name every command.
    #[test]
    fn the_rest_goes_to_the_whole_tree() {
        for line in [
            &["backup", "--help"][..],
            &["backup", "-V"],
            &["--version"],
            &["backup", "--no-such-option", "/x"],
            &["snapshot"],
            &["help", "backup"],
            &["config", "repo", "list"],
            &["-r"],
            &["-qr", "backup"],
            &["-qr", "snapshots", "--json"],
            &[],
        ] {
            assert!(small_tree_matches(&words(line)).is_none(), "{line:?}");
        }
        let e = parse(&words(&["bakup"])).unwrap_err();
        assert_eq!(e.kind(), clap::error::ErrorKind::InvalidSubcommand);
        assert!(e.to_string().contains("backup"), "{e}");
        let help = parse(&words(&["backup", "--help"]))
            .unwrap_err()
            .to_string();
        assert!(help.contains("Exit codes:"), "{help}");
    }
}
