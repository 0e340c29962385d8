//! `[cluster]` validation: checked without connecting, every problem with its key, the URL
//! (which may hold a password) never quoted.

use std::time::Duration;

use super::*;

use super::tests::MINIMAL;

fn load(cluster: &str, env: &Environment) -> Result<Config, ConfigErrors> {
    Config::from_toml_str(&format!("{MINIMAL}\n{cluster}"), None, env)
}

#[test]
fn no_cluster_table_is_one_host_even_with_the_variable_set() {
    let env = Environment {
        cluster_url: Some(Secret::new("postgresql://db/ephemer")),
        ..Environment::default()
    };
    assert!(load("", &env).unwrap().cluster.is_none());
}

#[test]
fn a_cluster_table_gets_its_defaults_and_the_url_from_the_environment() {
    let env = Environment {
        cluster_url: Some(Secret::new(
            "postgresql://u:pw@db.internal/ephemer?sslmode=require",
        )),
        ..Environment::default()
    };
    let c = load("[cluster]\nhost = \"mini-07\"", &env).unwrap();
    let cluster = c.cluster.unwrap();
    assert_eq!(
        cluster.url.expose(),
        "postgresql://u:pw@db.internal/ephemer?sslmode=require"
    );
    assert_eq!(cluster.host, "mini-07");
    assert_eq!(cluster.lease, Duration::from_secs(30));
    assert_eq!(cluster.heartbeat(), Duration::from_secs(10));
    assert_eq!(cluster.pool_size, 4);
    // The file's url wins over the variable.
    let c = load(
        "[cluster]\nurl = \"postgres://other/db2?sslmode=require\"",
        &env,
    )
    .unwrap();
    assert_eq!(
        c.cluster.unwrap().url.expose(),
        "postgres://other/db2?sslmode=require"
    );
    // No host: the hostname.
    let c = load("[cluster]", &env).unwrap();
    assert!(!c.cluster.unwrap().host.is_empty());
}

#[test]
fn every_cluster_problem_is_named_and_the_url_never_quoted() {
    let errors = load(
        "[cluster]\nurl = \"mysql://root:hunter2@db/x\"\nhost = \"has space\"\nlease = \"1s\"\npool_size = 0\nport = 5432",
        &Environment::default(),
    )
    .unwrap_err()
    .0;
    let keys: Vec<&str> = errors.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "cluster.port",
            "cluster.url",
            "cluster.host",
            "cluster.lease",
            "cluster.pool_size"
        ],
        "{errors:?}"
    );
    assert!(errors.iter().all(|e| !e.reason.contains("hunter2")));

    let errors = load("[cluster]", &Environment::default()).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].key, "cluster.url");
    assert!(errors[0].reason.contains("EPHEMER_CLUSTER_URL"));

    let errors = load(
        "[cluster]\nurl = \"postgresql://u:hunter2@db.internal\"",
        &Environment::default(),
    )
    .unwrap_err()
    .0;
    assert_eq!(errors[0].key, "cluster.url");
    assert!(errors[0].reason.contains("names no database"), "{errors:?}");
    assert!(!errors[0].reason.contains("hunter2"));
}

/// A ledger off this host is reached over TLS nobody on the path can strip (`sslmode=require`),
/// or `allow_insecure` says otherwise; one on this host (loopback, a unix socket) needs neither.
#[test]
fn a_ledger_off_this_host_needs_tls_that_cannot_be_stripped() {
    let env = Environment::default();
    for (url, extra, ok) in [
        ("postgresql://u:pw@db.internal/ephemer", "", false),
        (
            "postgresql://u:pw@db.internal/ephemer?sslmode=prefer",
            "",
            false,
        ),
        (
            "postgresql://u:pw@db.internal/ephemer?sslmode=disable",
            "",
            false,
        ),
        (
            "postgresql://u:pw@db.internal/ephemer?sslmode=require",
            "",
            true,
        ),
        (
            "postgresql://u:pw@db.internal/ephemer",
            "allow_insecure = true",
            true,
        ),
        ("postgresql://u:pw@127.0.0.1:5432/ephemer", "", true),
        ("postgresql://u:pw@localhost/ephemer", "", true),
        ("postgresql://u:pw@[::1]/ephemer", "", true),
        ("postgresql:///ephemer?host=/run/postgresql", "", true),
        // The name is local, the address the connection goes to is not (issue 52, item 4).
        (
            "postgresql://u:pw@localhost/ephemer?hostaddr=10.1.2.3",
            "",
            false,
        ),
        (
            "postgresql://u:pw@localhost/ephemer?hostaddr=127.0.0.2",
            "",
            true,
        ),
        (
            "postgresql://u:pw@db.internal/ephemer?hostaddr=127.0.0.1",
            "",
            false,
        ),
        (
            "postgresql://u:pw@localhost/ephemer?hostaddr=10.1.2.3&sslmode=require",
            "",
            true,
        ),
    ] {
        let text = format!("[cluster]\nurl = \"{url}\"\n{extra}");
        let got = load(&text, &env);
        assert_eq!(got.is_ok(), ok, "{url} {extra}: {got:?}");
        if let Err(e) = got {
            assert!(e.0[0].reason.contains("sslmode=require"), "{e:?}");
            assert!(!e.0[0].reason.contains("pw@"));
        }
    }
}
