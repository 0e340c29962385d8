//! tart's command line, as tart's own source declares it: the subcommands the daemon calls and
//! every option each takes. The daemon's calls, the stand-in `tart` of the tests and the
//! `run_args` an operator writes are checked against it, so a flag that does not exist (or
//! means something else) fails here, not on a Mac.
//!
//! Source: cirruslabs/tart at 5287b59 (2026-05-12), `Sources/tart/Commands/{Clone,Run,IP,
//! Exec,List,Stop,Delete}.swift`. Swift ArgumentParser spells a property `noGraphics` as
//! `--no-graphics`; `name: [.short, .long]` adds `-t` for `timeout`; `.customShort("i")` is `-i`.

/// One subcommand: its name, its options (`--name` of a flag or of an option that takes a
/// value) and how many positional arguments it takes at most (`None`: any number, `exec`'s
/// command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subcommand {
    /// `tart NAME`.
    pub name: &'static str,
    /// Options without a value.
    pub flags: &'static [&'static str],
    /// Options that take a value (`--wait 60` or `--wait=60`).
    pub options: &'static [&'static str],
    /// Positional arguments at most; `None` for a trailing command.
    pub positional: Option<usize>,
}

/// The subcommands the daemon calls.
pub const TART: &[Subcommand] = &[
    Subcommand {
        name: "clone",
        flags: &["--insecure", "--deduplicate"],
        options: &["--concurrency", "--prune-limit"],
        positional: Some(2),
    },
    Subcommand {
        name: "run",
        flags: &[
            "--no-graphics",
            "--serial",
            "--graphics",
            "--no-audio",
            "--no-clipboard",
            "--recovery",
            "--vnc",
            "--vnc-experimental",
            "--nested",
            "--net-softnet",
            "--net-host",
            "--suspendable",
            "--capture-system-keys",
            "--no-trackpad",
            "--no-pointer",
            "--no-keyboard",
        ],
        options: &[
            "--serial-path",
            "--disk",
            "--rosetta",
            "--dir",
            "--net-bridged",
            "--net-softnet-allow",
            "--net-softnet-block",
            "--net-softnet-expose",
            "--root-disk-opts",
        ],
        positional: Some(1),
    },
    Subcommand {
        name: "ip",
        flags: &[],
        options: &["--wait", "--resolver"],
        positional: Some(1),
    },
    Subcommand {
        name: "exec",
        flags: &["-i", "-t", "--help"],
        options: &[],
        positional: None,
    },
    Subcommand {
        name: "list",
        flags: &["-q", "--quiet"],
        options: &["--source", "--format"],
        positional: Some(0),
    },
    Subcommand {
        name: "stop",
        flags: &[],
        options: &["--timeout", "-t"],
        positional: Some(1),
    },
    Subcommand {
        name: "delete",
        flags: &[],
        options: &[],
        positional: Some(1),
    },
];

/// Whether `argv` (after `tart`) is a call tart understands: a known subcommand, each option
/// one it declares (a value where it takes one), no more positional arguments than it takes.
/// What is wrong otherwise.
pub fn check(argv: &[&str]) -> Result<(), String> {
    let Some((name, rest)) = argv.split_first() else {
        return Err("no subcommand".into());
    };
    let Some(sub) = TART.iter().find(|s| s.name == *name) else {
        return Err(format!(
            "`tart {name}` is not a subcommand the daemon may call"
        ));
    };
    let mut positional = 0;
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        if !arg.starts_with('-') {
            positional += 1;
            // `exec NAME COMMAND...`: everything after the VM's name is the guest's.
            if sub.positional.is_none() {
                break;
            }
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v)),
            None => (*arg, None),
        };
        if sub.flags.contains(&flag) && inline.is_none() {
            continue;
        }
        if sub.options.contains(&flag) {
            if inline.is_none() && args.next().is_none() {
                return Err(format!("`tart {name} {flag}` needs a value"));
            }
            continue;
        }
        return Err(format!("`{arg}` is not an option of `tart {name}`"));
    }
    match sub.positional {
        Some(most) if positional > most => Err(format!(
            "`tart {name}` takes {most} arguments, not {positional}"
        )),
        _ => Ok(()),
    }
}

/// One of a pool's `run_args`: an option of `tart run`, with its value after `=` where it
/// takes one (each entry stands alone: the VM's name follows them).
pub fn check_run_arg(arg: &str) -> Result<(), String> {
    let run = TART
        .iter()
        .find(|s| s.name == "run")
        .expect("run is listed");
    let flag = arg.split_once('=').map_or(arg, |(f, _)| f);
    if run.options.contains(&flag) && !arg.contains('=') {
        return Err(format!("`{arg}` takes a value: write `{arg}=VALUE`"));
    }
    check(&["run", arg, "vm"])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_s_calls_are_tart_s() {
        for call in [
            "clone ghcr.io/cirruslabs/macos-sequoia-xcode:latest ephemer-vm-macos-1",
            "run --no-graphics ephemer-vm-macos-1",
            "run --no-graphics --net-softnet --dir=cache:/Users/ci/cache ephemer-vm-macos-1",
            "ip --wait 180 ephemer-vm-macos-1",
            "exec --help",
            "exec ephemer-vm-macos-1 cat /etc/ssh/ssh_host_ed25519_key.pub",
            "list --format json",
            "stop --timeout 30 ephemer-vm-macos-1",
            "delete ephemer-vm-macos-1",
        ] {
            let argv: Vec<&str> = call.split(' ').collect();
            assert_eq!(check(&argv), Ok(()), "{call}");
        }
    }

    #[test]
    fn what_tart_does_not_declare_is_refused_with_why() {
        let refused = |call: &str| check(&call.split(' ').collect::<Vec<_>>()).unwrap_err();
        assert!(refused("run --net-sofnet vm").contains("`--net-sofnet` is not an option"));
        assert!(refused("run --no-graphics=1 vm").contains("not an option"));
        assert!(refused("ip --wait").contains("needs a value"));
        assert!(refused("stop --timeout 30 a b").contains("takes 1 arguments, not 2"));
        assert!(refused("suspend vm").contains("not a subcommand"));
        assert!(check(&[]).is_err());
    }

    #[test]
    fn a_run_arg_stands_alone() {
        assert_eq!(check_run_arg("--net-softnet"), Ok(()));
        assert_eq!(check_run_arg("--net-softnet-allow=10.0.0.0/8"), Ok(()));
        assert!(
            check_run_arg("--dir")
                .unwrap_err()
                .contains("write `--dir=VALUE`")
        );
        assert!(check_run_arg("--net-sofnet").is_err());
        assert!(check_run_arg("rm -rf").is_err());
    }
}
