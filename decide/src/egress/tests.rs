use super::*;

#[test]
fn slots_tile_the_range_with_a_30_each() {
    let first = Slot(0);
    assert_eq!(first.host_addr(), Ipv4Addr::new(10, 213, 0, 1));
    assert_eq!(first.ns_addr(), Ipv4Addr::new(10, 213, 0, 2));
    let last = Slot(SLOTS - 1);
    assert_eq!(last.ns_addr(), Ipv4Addr::new(10, 213, 255, 254));
    assert_eq!(Slot(70).host_if(), "ejh70");
    assert!(Slot(SLOTS - 1).host_if().len() <= 15 && Slot(SLOTS - 1).ns_if().len() <= 15);
    assert_eq!(Slot::of_netns(&Slot(42).netns()), Some(Slot(42)));
    assert_eq!(Slot::of_netns("ephemer-99999"), None);
    assert_eq!(Slot::of_netns("other-1"), None);
}

#[test]
fn a_name_picks_where_its_search_starts_and_the_search_covers_every_slot() {
    let a: Vec<Slot> = Slot::candidates("vm-a").take(3).collect();
    assert_eq!(Slot::candidates("vm-a").next(), Some(a[0]), "stable");
    assert_eq!(a[1].0, (a[0].0 + 1) % SLOTS);
    assert_ne!(Slot::candidates("vm-b").next(), Some(a[0]));
    let mut all: Vec<u16> = Slot::candidates("x").map(|s| s.0).collect();
    all.sort_unstable();
    assert_eq!(all, (0..SLOTS).collect::<Vec<_>>());
}

/// The rules a review tried to pass: the host (every address of it), the metadata address,
/// another job, IPv6, the private ranges.
#[test]
fn the_host_table_fences_every_job_interface() {
    let t = host_table();
    assert!(t.contains("input iifname \"ejh*\" counter drop"), "{t}");
    assert!(t.contains("from_job oifname \"ejh*\" counter drop"), "{t}");
    assert!(t.contains("meta nfproto ipv6 counter drop"), "{t}");
    assert!(
        t.contains("169.254.0.0/16") && t.contains("168.63.129.16/32"),
        "{t}"
    );
    for range in DENIED_V4 {
        assert!(t.contains(range), "{range}");
    }
    // An allowance is looked at before the deny set, and only for its own interface.
    let allow = t.find("@allowed accept").unwrap();
    assert!(allow < t.find("@denied4 counter drop").unwrap());
    assert!(t.contains("iifname . ip daddr @allowed"));
    // A pool's own chain comes after the fence every job has; what started goes on.
    assert!(t.find("@denied4 counter drop").unwrap() < t.find("iifname vmap @jobs").unwrap());
    assert!(
        t.find("ct state established,related accept comment")
            .unwrap()
            < t.find("from_job oifname").unwrap()
    );
    assert!(!t.contains("flush map"), "the jobs' entries are kept");
    // Rebuilt whole by each daemon, the allowances of others kept.
    assert!(
        t.contains("flush chain inet ephemer from_job")
            && !t.contains("flush set inet ephemer allowed")
    );
}

#[test]
fn a_pool_s_private_ranges_are_its_jobs_own() {
    let ranges = vec!["10.20.0.0/16".to_string()];
    assert_eq!(
        allow_commands(Slot(3), &ranges),
        "add element inet ephemer allowed { \"ejh3\" . 10.20.0.0/16 }\n"
    );
    assert!(forget_commands(Slot(3), &ranges).starts_with("delete element"));
    assert_eq!(allow_commands(Slot(3), &[]), "");
}

#[test]
fn the_link_joins_the_namespace_to_its_gateway() {
    let h = host_link_commands(Slot(5));
    assert!(
        h.starts_with("link add ejh5 type veth peer name ejn5 netns ephemer-5\n"),
        "{h}"
    );
    assert!(h.contains("addr add 10.213.0.21/30 dev ejh5"), "{h}");
    let n = ns_link_commands(Slot(5));
    assert!(n.contains("addr add 10.213.0.22/30 dev ejn5"), "{n}");
    assert!(n.contains("route add default via 10.213.0.21"), "{n}");
    assert!(!n.contains("-n "), "ip -batch takes no -n per line");
    let j = job_table();
    assert!(j.contains("udp dport 53 dnat to 127.0.0.1:53") && j.contains("tcp dport 53"));
}

#[test]
fn name_servers_are_read_from_resolv_conf() {
    let text = "# a comment\nsearch corp\nnameserver 127.0.0.53\nnameserver fe80::1%eth0\nnameserver  10.0.0.2 \nnameserver bogus\n";
    let found: Vec<String> = nameservers(text).iter().map(|a| a.to_string()).collect();
    assert_eq!(found, ["127.0.0.53", "fe80::1", "10.0.0.2"]);
}

#[test]
fn a_slot_s_allowances_are_read_back_whoever_wrote_them() {
    // What nftables 1.0.6 answers here for the host's `allowed` set.
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"set": {"family": "inet", "name": "allowed", "table": "ephemer", "type": ["ifname", "ipv4_addr"], "flags": ["interval"], "elem": [{"concat": ["ejh7", {"prefix": {"addr": "10.20.0.0", "len": 16}}]}, {"concat": ["ejh7", "192.168.1.5"]}, {"concat": ["ejh70", {"prefix": {"addr": "10.0.0.0", "len": 8}}]}, {"concat": ["ejh7", {"range": ["172.16.0.1", "172.16.0.9"]}]}, {"elem": {"val": {"concat": ["ejh7", "10.9.9.9"]}, "counter": {"packets": 0}}}]}}]}"#;
    assert_eq!(
        allowances_in(json, Slot(7)),
        [
            "10.20.0.0/16",
            "192.168.1.5",
            "172.16.0.1-172.16.0.9",
            "10.9.9.9"
        ]
    );
    assert_eq!(allowances_in(json, Slot(70)), ["10.0.0.0/8"]);
    assert!(allowances_in(json, Slot(8)).is_empty());
    assert!(allowances_in("not json", Slot(7)).is_empty());
    assert_eq!(
        forget_commands(Slot(7), &allowances_in(json, Slot(7))[..2]),
        "delete element inet ephemer allowed { \"ejh7\" . 10.20.0.0/16, \"ejh7\" . 192.168.1.5 }\n"
    );
}
