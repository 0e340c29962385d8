//! What the guest side runs: the remote shell that reads the runner's variables, the CA bundle and
//! the JIT config from standard input, and what the host writes there.

use crate::provision::{CA_VARS, RunnerEnv};

/// The guest's file for the CA bundle.
const GUEST_CA: &str = "$HOME/.ephemer-actors-ca.pem";

/// The remote shell command: reads `NAME=<base64>` lines up to an empty one into the
/// environment (`_CA` into [`GUEST_CA`], pointed at by the CA variables), then the JIT config
/// (the rest of stdin), then runs the runner. Nothing secret is on the command line.
pub(super) fn remote_command(runner_command: &str) -> String {
    let ca_vars: String = CA_VARS
        .iter()
        .map(|v| format!("export {v}=\"{GUEST_CA}\"; "))
        .collect();
    format!(
        "umask 077; while IFS= read -r l && [ -n \"$l\" ]; do n=${{l%%=*}}; \
         v=$(printf %s \"${{l#*=}}\" | base64 -d) || exit 1; \
         if [ \"$n\" = _CA ]; then printf '%s\\n' \"$v\" > \"{GUEST_CA}\"; {ca_vars}\
         else export \"$n=$v\"; fi; done; \
         c=$(cat) && ACTIONS_RUNNER_INPUT_JITCONFIG=\"$c\" RUNNER_MANUALLY_TRAP_SIG=1 \
         {version_exit}=1 exec {runner_command}",
        version_exit = crate::vocab::runner_vars::VERSION_EXIT
    )
}

/// What [`remote_command`] reads on stdin, and a `linux_vm` guest's agent on its port.
pub(in crate::provision) fn stdin_payload(env: &RunnerEnv, jit_config: &str) -> Vec<u8> {
    use base64::Engine;
    let b64 = |v: &[u8]| base64::engine::general_purpose::STANDARD.encode(v);
    let mut out = String::new();
    for (name, value) in &env.vars {
        out.push_str(&format!("{name}={}\n", b64(value.expose().as_bytes())));
    }
    if let Some(ca) = env.ca_bundle.as_ref().and_then(|p| std::fs::read(p).ok()) {
        out.push_str(&format!("_CA={}\n", b64(&ca)));
    }
    out.push('\n');
    out.push_str(jit_config);
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    /// The guest side runs in a POSIX shell; this one is the host's, which reads the same.
    #[test]
    fn the_guest_shell_gets_the_variables_the_ca_and_the_jit_config_from_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let env = RunnerEnv {
            vars: vec![
                ("https_proxy".into(), Secret::new("http://u:p@proxy:3128")),
                ("TEAM".into(), Secret::new("a b $c \"d\"")),
            ],
            ca_bundle: Some(ca),
        };
        let out = dir.path().join("env");
        let script = remote_command(&format!("env > {}", out.display()));
        let mut child = std::process::Command::new("sh")
            .args(["-c", &script])
            .env_clear()
            .env("HOME", dir.path())
            .env("PATH", std::env::var("PATH").unwrap())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&stdin_payload(&env, "JIT-123"))
            .unwrap();
        assert!(child.wait().unwrap().success());
        let seen = std::fs::read_to_string(&out).unwrap();
        assert!(
            seen.contains("https_proxy=http://u:p@proxy:3128\n"),
            "{seen}"
        );
        assert!(seen.contains("TEAM=a b $c \"d\"\n"), "{seen}");
        assert!(
            seen.contains("ACTIONS_RUNNER_INPUT_JITCONFIG=JIT-123\n"),
            "{seen}"
        );
        assert!(
            seen.contains("ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1\n"),
            "a refused version exits 7: {seen}"
        );
        let guest_ca = dir.path().join(".ephemer-actors-ca.pem");
        assert!(
            seen.contains(&format!("SSL_CERT_FILE={}", guest_ca.display())),
            "{seen}"
        );
        assert!(std::fs::read_to_string(guest_ca).unwrap().contains("AAAA"));
    }
}
