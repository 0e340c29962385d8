//! What the per-namespace DNS forwarder checks of a message before it passes one on: that it
//! is a query (or, back from upstream, the answer to that very query), within the sizes DNS
//! uses. The forwarder itself (sockets, upstreams, time) is the daemon's.

/// The largest message over UDP the forwarder passes on (EDNS's common ceiling).
pub const MAX_UDP: usize = 4096;
/// The largest message over TCP it passes on (a length prefix allows 65,535).
pub const MAX_TCP: usize = 65_535;
/// How many queries of one namespace may wait for upstream at once; more are dropped (the
/// resolver asks again).
pub const MAX_IN_FLIGHT: usize = 64;

/// The header's id of `msg`, when it is at least a header.
pub fn id(msg: &[u8]) -> Option<u16> {
    (msg.len() >= 12).then(|| u16::from_be_bytes([msg[0], msg[1]]))
}

/// Whether `msg` is a standard query with one question, small enough to pass on.
pub fn is_query(msg: &[u8], max: usize) -> bool {
    msg.len() >= 12
        && msg.len() <= max
        && msg[2] & 0x80 == 0
        && msg[2] & 0x78 == 0
        && questions(msg) == 1
}

/// Whether `answer` answers `query`: a response, the same id, the same question section.
pub fn answers(query: &[u8], answer: &[u8]) -> bool {
    let (Some(q), Some(a)) = (question(query), question(answer)) else {
        return false;
    };
    answer.len() >= 12
        && answer[2] & 0x80 != 0
        && id(query) == id(answer)
        && q.eq_ignore_ascii_case(a)
}

/// A standard query for `name`'s A record with id `id` (what a resolver sends; the tests'
/// and the doctor's probe).
pub fn query(id: u16, name: &str) -> Vec<u8> {
    let mut m = id.to_be_bytes().to_vec();
    m.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        let label = &label.as_bytes()[..label.len().min(63)];
        m.push(label.len() as u8);
        m.extend(label);
    }
    m.extend([0, 0, 1, 0, 1]);
    m
}

/// `msg` with transaction id `id`: a query is asked upstream under an id of the forwarder's
/// own (the job's is never sent on, so nothing outside learns or steers it), and the answer is
/// handed back under the job's.
pub fn with_id(msg: &[u8], id: u16) -> Vec<u8> {
    let mut m = msg.to_vec();
    if let Some(head) = m.get_mut(..2) {
        head.copy_from_slice(&id.to_be_bytes());
    }
    m
}

/// The name `query` asks about, lowercased and dotted (`github.com`), when its question is
/// well formed.
pub fn question_name(query: &[u8]) -> Option<String> {
    let q = question(query)?;
    let mut name = String::new();
    let mut at = 0;
    while let Some(&len) = q.get(at) {
        if len == 0 {
            break;
        }
        let label = q.get(at + 1..at + 1 + usize::from(len))?;
        if !name.is_empty() {
            name.push('.');
        }
        push_label(&mut name, label);
        at += 1 + usize::from(len);
    }
    Some(name)
}

/// A label as text: letters lowercased; a byte a host name cannot hold (a space, a newline, a
/// dot inside the label, any control or non-ASCII byte) written `\DDD`, as a zone file writes
/// it, so a name is one token of printable ASCII that cannot forge a log line or a second
/// name, and a name a list allows is never spelled two ways.
fn push_label(name: &mut String, label: &[u8]) {
    for &b in label {
        match b {
            b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'*' => name.push(char::from(b)),
            b'A'..=b'Z' => name.push(char::from(b.to_ascii_lowercase())),
            _ => name.push_str(&format!("\\{b:03}")),
        }
    }
}

/// The IPv4 and IPv6 addresses `answer`'s answer section gives, each with its TTL (seconds);
/// records of other types (a CNAME on the way) are passed over. Empty when the message is not
/// well formed: nothing is pinned from what cannot be read.
pub fn addresses(answer: &[u8]) -> Vec<(core::net::IpAddr, u32)> {
    read_addresses(answer).unwrap_or_default()
}

fn read_addresses(msg: &[u8]) -> Option<Vec<(core::net::IpAddr, u32)>> {
    let count = u16::from_be_bytes([*msg.get(6)?, *msg.get(7)?]);
    let mut at = 12 + question(msg)?.len();
    let mut out = Vec::new();
    for _ in 0..count {
        at = skip_name(msg, at)?;
        let fixed = msg.get(at..at + 10)?;
        let kind = u16::from_be_bytes([fixed[0], fixed[1]]);
        let class = u16::from_be_bytes([fixed[2], fixed[3]]);
        let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
        let len = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        let data = msg.get(at + 10..at + 10 + len)?;
        match (kind, class, data.len()) {
            (1, 1, 4) => out.push((
                core::net::IpAddr::from([data[0], data[1], data[2], data[3]]),
                ttl,
            )),
            (28, 1, 16) => {
                let bytes: [u8; 16] = data.try_into().ok()?;
                out.push((core::net::IpAddr::from(bytes), ttl));
            }
            _ => {}
        }
        at += 10 + len;
    }
    Some(out)
}

/// Where the name at `at` ends: after its last label's zero, or after a pointer.
fn skip_name(msg: &[u8], mut at: usize) -> Option<usize> {
    loop {
        let len = *msg.get(at)?;
        match len {
            0 => return Some(at + 1),
            l if l & 0xc0 == 0xc0 => {
                msg.get(at + 1)?;
                return Some(at + 2);
            }
            l if l > 63 => return None,
            l => at += 1 + usize::from(l),
        }
    }
}

/// The answer that refuses `query` (`REFUSED`, its question echoed, no records): what a job
/// gets for a name its pool does not allow.
pub fn refused(query: &[u8]) -> Option<Vec<u8>> {
    let q = question(query)?;
    let mut m = query.get(..2)?.to_vec();
    // QR set, the opcode and RD kept; RA set; RCODE 5 (refused).
    m.push(0x80 | (query[2] & 0x79));
    m.push(0x80 | 5);
    m.extend([0, 1, 0, 0, 0, 0, 0, 0]);
    m.extend(q);
    Some(m)
}

fn questions(msg: &[u8]) -> u16 {
    u16::from_be_bytes([msg[4], msg[5]])
}

/// The longest name a question may carry, in wire octets (its lengths and the root's 0 too).
pub const NAME_WIRE_MAX: usize = 255;

/// The first question (name, type, class) as bytes, when it is well formed.
fn question(msg: &[u8]) -> Option<&[u8]> {
    if msg.len() < 12 || questions(msg) == 0 {
        return None;
    }
    let mut at = 12;
    loop {
        let len = usize::from(*msg.get(at)?);
        if len == 0 {
            at += 1;
            break;
        }
        // A pointer has no place in a question's name; labels are at most 63 bytes, and the
        // whole name at most 255 on the wire (RFC 1035, 2.3.4).
        if len > 63 || at + 1 + len - 12 > NAME_WIRE_MAX - 1 {
            return None;
        }
        at += 1 + len;
    }
    msg.get(12..at + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_and_its_answer_are_told_and_matched() {
        let q = query(0x1234, "github.com");
        assert!(is_query(&q, MAX_UDP));
        assert_eq!(id(&q), Some(0x1234));
        let mut a = q.clone();
        a[2] |= 0x80;
        a.extend([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 140, 82, 121, 4]);
        assert!(answers(&q, &a));
        assert!(!is_query(&a, MAX_UDP), "an answer is no query");
        let mut other = a.clone();
        other[1] ^= 1;
        assert!(!answers(&q, &other), "another id");
        let mut spoof = query(0x1234, "evil.example");
        spoof[2] |= 0x80;
        assert!(!answers(&q, &spoof), "another question");
    }

    #[test]
    fn an_answer_s_addresses_are_read_with_their_ttls_past_a_cname() {
        let q = query(7, "Objects.GitHubUserContent.com");
        assert_eq!(
            question_name(&q).as_deref(),
            Some("objects.githubusercontent.com")
        );
        let mut a = q.clone();
        a[2] |= 0x80;
        a[7] = 3;
        // A CNAME (pointer to the question's name, rdata a name), then an A and an AAAA.
        a.extend([0xc0, 12, 0, 5, 0, 1, 0, 0, 1, 0, 0, 4, 1, b'x', 0xc0, 12]);
        a.extend([0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 185, 199, 108, 133]);
        a.extend([0xc0, 12, 0, 28, 0, 1, 0, 0, 0, 30, 0, 16]);
        a.extend([
            0x26, 0x06, 0x50, 0xc0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x54,
        ]);
        let got = addresses(&a);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], ("185.199.108.133".parse().unwrap(), 60));
        assert_eq!(got[1], ("2606:50c0:8000::154".parse().unwrap(), 30));
        let mut cut = a.clone();
        cut.truncate(a.len() - 3);
        assert!(
            addresses(&cut).is_empty(),
            "a record cut short pins nothing"
        );
        let mut liar = a.clone();
        liar[7] = 9;
        assert!(
            addresses(&liar).is_empty(),
            "more records said than there are"
        );
    }

    #[test]
    fn a_refusal_echoes_the_question_and_says_refused() {
        let q = query(0x4242, "pastebin.com");
        let r = refused(&q).unwrap();
        assert!(answers(&q, &r));
        assert_eq!(r[3] & 0x0f, 5, "REFUSED");
        assert!(addresses(&r).is_empty());
        assert!(refused(&[0; 5]).is_none());
    }

    #[test]
    fn what_is_no_query_is_not_passed_on() {
        assert!(!is_query(&[0; 11], MAX_UDP), "short of a header");
        assert!(!is_query(&query(1, &"a".repeat(60)), 30), "past the size");
        let mut update = query(1, "x.com");
        update[2] = 0x28; // opcode 5, an update
        assert!(!is_query(&update, MAX_UDP));
        let mut two = query(1, "x.com");
        two[5] = 2;
        assert!(!is_query(&two, MAX_UDP));
        let mut bad = query(1, "x.com");
        bad[12] = 0xc0;
        assert!(question(&bad).is_none(), "a pointer in a question");
    }

    /// A query whose question's labels are `labels`, byte for byte.
    fn raw_query(labels: &[&[u8]]) -> Vec<u8> {
        let mut m = vec![0, 1, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in labels {
            m.push(l.len() as u8);
            m.extend(*l);
        }
        m.extend([0, 0, 1, 0, 1]);
        m
    }

    #[test]
    fn an_id_is_swapped_and_nothing_else() {
        let q = query(0x1234, "github.com");
        let upstream = with_id(&q, 0xbeef);
        assert_eq!(id(&upstream), Some(0xbeef));
        assert_eq!(upstream[2..], q[2..]);
        assert_eq!(with_id(&upstream, 0x1234), q);
        assert_eq!(with_id(&[7], 1), [7], "too short to have an id: as it was");
    }

    #[test]
    fn a_name_is_one_printable_token_and_no_longer_than_dns_allows() {
        // A newline and a fake log line inside a label, a space, a dot inside a label.
        let forged = raw_query(&[
            b"x\n1700000000 0 pastebin.com",
            b"Evil Host",
            b"a.b",
            b"com",
        ]);
        let name = question_name(&forged).unwrap();
        assert_eq!(
            name,
            "x\\0101700000000\\0320\\032pastebin\\046com.evil\\032host.a\\046b.com"
        );
        assert!(name.bytes().all(|b| b.is_ascii_graphic()), "{name}");
        assert_eq!(
            question_name(&raw_query(&[b"\xff\x00"])).unwrap(),
            "\\255\\000"
        );
        // 255 octets on the wire at most: four labels of 63 fit (253 octets), a fifth does not.
        let l63 = [b'a'; 63];
        let fits = raw_query(&[&l63, &l63, &l63, &l63[..61]]);
        assert_eq!(question_name(&fits).map(|n| n.len()), Some(253));
        let over = raw_query(&[&l63, &l63, &l63, &l63, b"x"]);
        assert_eq!(
            question_name(&over),
            None,
            "a name past 255 octets is no question"
        );
    }

    proptest::proptest! {
        /// Whatever a job or an upstream sends, reading it ends and panics nowhere.
        #[test]
        fn any_bytes_are_read_without_a_panic(msg in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = addresses(&msg);
            let _ = question_name(&msg);
            let _ = refused(&msg);
            let _ = is_query(&msg, MAX_UDP);
        }
    }
}
