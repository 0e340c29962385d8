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

fn questions(msg: &[u8]) -> u16 {
    u16::from_be_bytes([msg[4], msg[5]])
}

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
        // A pointer has no place in a question's name; labels are at most 63 bytes.
        if len > 63 {
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
}
