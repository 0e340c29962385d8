//! `ephemer-actors egress --pool NAME --since 7d`: the names a pool's jobs looked up (in
//! `audit` or `allow-list` mode), how often, and which its allow-list refuses, from a running
//! daemon (`GET /api/v1/egress`); then the `allow` line that would let them all through, to
//! review before it goes in the config (docs/operations.md, "From an audit to an allow-list").

use actix_web::http::Method;
use ephemer_actors_core::admin::egress::EgressAnswer;

use crate::ctl::{Target, call, print_json};

/// Prints pool `pool`'s lookups since `since` (a span: `7d`, `12h`), as a table or JSON.
pub fn egress(t: &Target, pool: &str, since: &str) -> anyhow::Result<()> {
    let keep = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '+'))
            .collect()
    };
    let path = format!("/api/v1/egress?pool={}&since={}", keep(pool), keep(since));
    let v: EgressAnswer = call(t, Method::GET, &path)?;
    if t.json {
        return print_json(&v);
    }
    print!("{}", crate::term::printable(&text(&v)));
    Ok(())
}

/// The table, and the `allow` line for the names the list refuses.
fn text(v: &EgressAnswer) -> String {
    if v.names.is_empty() {
        return format!(
            "pool {}: no lookups recorded in this window (its egress mode is \"audit\" or \
             \"allow-list\"? its jobs ran since?)\n",
            v.pool
        );
    }
    let mut out = format!("{:<60} {:>8}  {}\n", "NAME", "LOOKUPS", "THE LIST");
    for n in &v.names {
        let verdict = if n.refused { "refuses" } else { "allows" };
        out += &format!("{:<60} {:>8}  {verdict}\n", n.name, n.lookups);
    }
    let refused: Vec<String> = v
        .names
        .iter()
        .filter(|n| n.refused)
        .map(|n| format!("{:?}", n.name))
        .collect();
    if !refused.is_empty() {
        out += &format!(
            "\n# to let these through, add them to providers.{}.egress.allow (review each first):\n# {}\n",
            v.pool,
            refused.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ephemer_actors_core::admin::egress::AskedName;

    #[test]
    fn the_table_lists_most_asked_first_and_ends_with_what_the_list_would_need() {
        let v = EgressAnswer {
            pool: "linux".into(),
            since_unix: 0,
            names: vec![
                AskedName {
                    name: "registry.npmjs.org".into(),
                    lookups: 40,
                    refused: true,
                },
                AskedName {
                    name: "github.com".into(),
                    lookups: 12,
                    refused: false,
                },
            ],
        };
        let t = text(&v);
        assert!(t.starts_with("NAME"), "{t}");
        assert!(t.find("registry.npmjs.org").unwrap() < t.find("github.com").unwrap());
        assert!(t.contains("refuses") && t.contains("allows"));
        assert!(t.ends_with("# \"registry.npmjs.org\"\n"), "{t}");
        let empty = EgressAnswer {
            pool: "p".into(),
            since_unix: 0,
            names: vec![],
        };
        assert!(text(&empty).contains("no lookups recorded"));
    }
}
