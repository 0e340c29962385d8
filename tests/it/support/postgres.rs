//! A throwaway PostgreSQL cluster for the fleet tests: `initdb` and `pg_ctl` from Debian's
//! `postgresql` package (`/usr/lib/postgresql/<version>/bin`) in a temp dir, on a free port,
//! as the `postgres` user the package creates when the tests run as root (PostgreSQL refuses
//! to run as root), removed afterwards. Without the binaries the tests skip loudly, or fail
//! where `EPHEMER_REQUIRE_ENGINES` is set (`.ci/run`).

use std::{path::PathBuf, process::Command};

use super::daemon::free_port;

/// A running cluster with a database `ephemer`.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
    as_postgres: bool,
    /// Serves TLS with these files (certificate, key) when set.
    tls: Option<(PathBuf, PathBuf)>,
    /// Loads `pg_stat_statements` (figures: round trips by statement).
    statements: bool,
}

/// The newest installed server's binaries.
fn binaries() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop()
}

impl Postgres {
    /// Starts one, or says why it cannot (after a loud skip message).
    pub fn start() -> Option<Postgres> {
        Self::start_with(None)
    }

    /// Like [`Postgres::start`], serving TLS with a certificate for 127.0.0.1.
    pub fn start_tls(identity: &github_standin::TlsIdentity) -> Option<Postgres> {
        Self::start_with(Some(identity))
    }

    fn start_with(identity: Option<&github_standin::TlsIdentity>) -> Option<Postgres> {
        let Some(bin) = binaries() else {
            super::skip(
                "PostgreSQL",
                "no /usr/lib/postgresql/*/bin/initdb (apt-get install postgresql)",
            );
            return None;
        };
        let as_postgres = nix::unistd::geteuid().is_root();
        let dir = tempfile::Builder::new()
            .prefix("ephemer-pg-")
            .tempdir()
            .unwrap();
        let owner = if as_postgres {
            let Some(user) = nix::unistd::User::from_name("postgres").ok().flatten() else {
                super::skip(
                    "PostgreSQL",
                    "running as root and there is no postgres user",
                );
                return None;
            };
            Some((user.uid.as_raw(), user.gid.as_raw()))
        } else {
            None
        };
        let give = |path: &std::path::Path| {
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
            }
        };
        give(dir.path());
        // PostgreSQL wants its key private to its own user.
        let tls = identity.map(|id| {
            use std::os::unix::fs::PermissionsExt as _;
            let cert = dir.path().join("server.crt");
            let key = dir.path().join("server.key");
            std::fs::write(&cert, &id.cert_pem).unwrap();
            std::fs::write(&key, &id.key_pem).unwrap();
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
            give(&cert);
            give(&key);
            (cert, key)
        });
        let pg = Postgres {
            dir,
            bin,
            port: free_port(),
            as_postgres,
            tls,
            statements: false,
        };
        let data = pg.data();
        pg.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        pg.start_server();
        pg.run(
            "createdb",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &pg.port.to_string(),
                "-U",
                "postgres",
                "ephemer",
            ],
        );
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn run(&self, tool: &str, args: &[&str]) -> String {
        let out = self
            .command(tool)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts (or restarts) the server, waiting until it accepts connections.
    pub fn start_server(&self) {
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        if self.statements {
            options.push_str(" -c shared_preload_libraries=pg_stat_statements");
        }
        if let Some((cert, key)) = &self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            ));
        }
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-o",
                &options,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        );
    }

    /// Restarts the server with `pg_stat_statements`, for counting statements by kind.
    pub fn with_statement_stats(mut self) -> Self {
        self.statements = true;
        self.stop_server();
        self.start_server();
        self.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        self
    }

    /// Stops the server at once (connections cut, as a crash or a failover does).
    pub fn stop_server(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    /// `postgresql://…/ephemer` for `cluster.url`: `sslmode=require` when it serves TLS.
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/ephemer?sslmode={}",
            self.port,
            if self.tls.is_some() {
                "require"
            } else {
                "disable"
            }
        )
    }

    /// Runs SQL through `psql`, unaligned, tuples only: one line per row, `|` between columns.
    pub fn query(&self, sql: &str) -> Vec<String> {
        self.run(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "ephemer",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
        )
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args([
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "immediate",
                "stop",
            ])
            .output();
    }
}
