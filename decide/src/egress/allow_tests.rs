use super::*;

fn list(entries: &[&str]) -> AllowList {
    let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
    AllowList::new(&entries, Some("ghes.example")).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn a_name_allows_itself_and_a_wildcard_every_name_under_it_but_not_itself() {
    let l = list(&["registry.npmjs.org", "*.example.com"]);
    assert!(l.allows_name("registry.npmjs.org"));
    assert!(
        l.allows_name("Registry.NPMJS.org."),
        "any case, a trailing dot"
    );
    assert!(
        !l.allows_name("evil.registry.npmjs.org"),
        "a name is that name only"
    );
    assert!(l.allows_name("a.example.com") && l.allows_name("a.b.example.com"));
    assert!(
        !l.allows_name("example.com"),
        "a wildcard is the names under it"
    );
    assert!(
        !l.allows_name("badexample.com"),
        "a label boundary, not a suffix"
    );
    assert!(l.allows_name("ghes.example"), "the GHES host is added");
    assert!(
        !l.allows_name("github.com"),
        "with a GHES target, github.com's hosts are not"
    );
}

#[test]
fn github_com_targets_get_the_runner_s_own_hosts() {
    let l = AllowList::new(&[], None).unwrap();
    for name in [
        "github.com",
        "api.github.com",
        "pipelines.actions.githubusercontent.com",
        "results-receiver.actions.githubusercontent.com",
        "objects.githubusercontent.com",
        "ghcr.io",
        "productionresultssa0.blob.core.windows.net",
    ] {
        assert!(l.allows_name(name), "{name}");
    }
    assert!(!l.allows_name("pastebin.com"));
}

#[test]
fn an_address_or_network_is_listed_by_its_prefix_in_its_own_family() {
    let l = list(&["10.1.2.3", "10.20.0.0/16", "2001:db8::/48"]);
    assert!(
        l.lists(ip("10.1.2.3")) && !l.lists(ip("10.1.2.4")),
        "a bare address is a /32"
    );
    assert!(l.lists(ip("10.20.255.1")) && !l.lists(ip("10.21.0.1")));
    assert!(l.lists(ip("2001:db8:0:ffff::1")) && !l.lists(ip("2001:db9::1")));
    assert!(
        !l.lists(ip("::ffff:10.1.2.3")),
        "v4 rules match v4 addresses only"
    );
    let all = list(&["0.0.0.0/0"]);
    assert!(
        all.lists(ip("203.0.113.9")),
        "a /0 is everything of its family"
    );
}

#[test]
fn every_entry_that_is_not_one_is_named_with_its_index() {
    let entries: Vec<String> = [
        "github.com",
        "",
        "exa mple.com",
        "*.*.example.com",
        "foo*.example.com",
        "10.0.0.1/33",
        "10.0.0/8",
        "10.1.2.3/16",
        "-bad.example.com",
        "2001:db8::1/64",
    ]
    .iter()
    .map(|e| e.to_string())
    .collect();
    let problems = AllowList::new(&entries, None).unwrap_err();
    let at: Vec<usize> = problems.iter().map(|(i, _)| *i).collect();
    assert_eq!(at, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(
        problems[6].1.to_string(),
        "`10.1.2.3/16` has bits set past its prefix; the network is 10.1.0.0/16"
    );
    assert_eq!(
        problems[8].1.to_string(),
        "`2001:db8::1/64` has bits set past its prefix; the network is 2001:db8::/64"
    );
    assert!(matches!(problems[2].1, RuleError::BadWildcard(_)));
}

#[test]
fn the_mode_decides_what_a_refused_name_or_address_meets() {
    let l = list(&["github.com", "10.9.0.0/16"]);
    let mut pins = Pins::default();
    assert_eq!(on_lookup(Mode::Open, &l, "pastebin.com"), Lookup::Answer);
    assert_eq!(
        on_lookup(Mode::Audit, &l, "pastebin.com"),
        Lookup::AnswerAudited
    );
    assert_eq!(on_lookup(Mode::Audit, &l, "github.com"), Lookup::Answer);
    assert_eq!(
        on_lookup(Mode::AllowList, &l, "pastebin.com"),
        Lookup::Refuse
    );
    assert_eq!(on_lookup(Mode::AllowList, &l, "github.com"), Lookup::Answer);
    let addr = ip("140.82.112.3");
    assert_eq!(
        on_connect(Mode::AllowList, &l, &pins, addr, 0),
        Lookup::Refuse
    );
    assert_eq!(
        on_connect(Mode::Audit, &l, &pins, addr, 0),
        Lookup::AnswerAudited
    );
    pins.pin(&[addr], 60, 0);
    assert_eq!(
        on_connect(Mode::AllowList, &l, &pins, addr, 59),
        Lookup::Answer
    );
    assert_eq!(
        on_connect(Mode::AllowList, &l, &pins, addr, 60),
        Lookup::Refuse,
        "an allowed name's address by literal after its TTL"
    );
    assert_eq!(
        on_connect(Mode::AllowList, &l, &pins, ip("10.9.1.1"), 0),
        Lookup::Answer
    );
    for (s, m) in [
        ("open", Mode::Open),
        ("audit", Mode::Audit),
        ("allow-list", Mode::AllowList),
    ] {
        assert_eq!(Mode::parse(s), Some(m));
        assert_eq!(m.as_str(), s);
    }
    assert_eq!(Mode::parse("allowlist"), None);
}

#[test]
fn a_pin_lasts_its_ttl_within_bounds_and_the_longest_answer_wins() {
    let mut pins = Pins::default();
    let a = ip("192.0.2.1");
    assert_eq!(
        pins.pin(&[a], 0, 100),
        [(a, PIN_MIN_SECS)],
        "a TTL of 0 still lets a client connect"
    );
    assert_eq!(
        pins.pin(&[a], 86_400, 100),
        [(a, PIN_MAX_SECS)],
        "a day-long TTL is cut"
    );
    assert_eq!(
        pins.pin(&[a], 10, 101),
        [(a, PIN_MAX_SECS - 1)],
        "the set entry keeps what is left of the longer pin"
    );
    assert!(
        pins.holds(a, 100 + PIN_MAX_SECS - 1),
        "a shorter later answer does not cut it"
    );
    assert!(pins.expire(100 + PIN_MAX_SECS - 1).is_empty());
    assert_eq!(pins.expire(100 + PIN_MAX_SECS), [a]);
    assert!(pins.is_empty() && !pins.holds(a, 0));
}

#[test]
fn an_audit_report_counts_each_name_once_most_asked_first() {
    let rows = report([
        ("pastebin.com", true),
        ("github.com", false),
        ("GitHub.com.", false),
        ("pastebin.com", true),
        ("pastebin.com", true),
        ("registry.npmjs.org", true),
    ]);
    let names: Vec<(&str, u64, bool)> = rows
        .iter()
        .map(|r| (r.name.as_str(), r.lookups, r.refused))
        .collect();
    assert_eq!(
        names,
        [
            ("pastebin.com", 3, true),
            ("github.com", 2, false),
            ("registry.npmjs.org", 1, true)
        ]
    );
}

/// `n` distinct addresses from `base` on.
fn addrs(base: u32, n: u32) -> Vec<IpAddr> {
    (base..base + n)
        .map(|i| IpAddr::V4(std::net::Ipv4Addr::from(0x0A00_0000 | i)))
        .collect()
}

/// `addrs` as an answer, each with `ttl`.
fn answer(addrs: &[IpAddr], ttl: u32) -> Vec<(IpAddr, u32)> {
    addrs.iter().map(|a| (*a, ttl)).collect()
}

#[test]
fn an_answer_pins_its_first_addresses_only_and_a_job_no_more_than_its_cap() {
    let mut pins = Pins::default();
    // One answer of 4,000 A records (a name a job's own server answers so).
    let huge = addrs(0, 4000);
    assert_eq!(pins.pin(&huge, 3600, 0).len(), ANSWER_PINS_MAX);
    assert_eq!(pins.len(), ANSWER_PINS_MAX);
    assert!(pins.holds(huge[0], 1) && !pins.holds(huge[ANSWER_PINS_MAX], 1));
    // A job looping lookups of such names: the pins stop at the job's cap.
    let mut refused = 0;
    for round in 0..1000u32 {
        let answer = addrs(10_000 + round * 64, 64);
        if pins.plan(&self::answer(&answer, 3600), 1).is_err() {
            refused += 1;
        } else {
            pins.pin(&answer, 3600, 1);
        }
    }
    assert_eq!(pins.len(), JOB_PINS_MAX);
    assert!(refused > 0, "answers past the cap are refused");
    // An address pinned already is renewed even at the cap; a new one is not taken.
    let held = addrs(0, 1);
    assert_eq!(
        pins.plan(&answer(&held, 3600), 2).map(|p| p.entries.len()),
        Ok(1)
    );
    assert_eq!(
        pins.plan(&answer(&addrs(900_000, 3), 3600), 2),
        Err(PinsFull::Job)
    );
    // When the pins run out, there is room again.
    assert!(
        pins.plan(&answer(&addrs(900_000, 3), 60), 1 + PIN_MAX_SECS)
            .is_ok()
    );
    assert!(pins.len() < JOB_PINS_MAX);
}

#[test]
fn a_planned_answer_is_pinned_only_once_committed() {
    let mut pins = Pins::default();
    let a = addrs(0, 3);
    let planned = pins.plan(&answer(&a, 60), 0).unwrap();
    assert_eq!(
        planned.timeouts(),
        a.iter().map(|ip| (*ip, 60)).collect::<Vec<_>>()
    );
    assert!(pins.is_empty(), "what nft refused to add is not kept");
    pins.commit(&planned);
    assert_eq!(pins.len(), 3);
    assert!(pins.holds(a[2], 59));
}
