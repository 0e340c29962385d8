//! The audit log's lines: each lookup a pool's job made in `audit` or `allow-list` mode, with
//! whether the list refuses its name, for `ephemer-actors egress` ([`report`](super::allow::report)).
//! One line a lookup: `<unix seconds> <refused: 0 or 1> <name>`.

use super::allow::normal;

/// Lines one job may write to its pool's audit log: a job looping lookups cannot rotate the
/// pool's whole log (and the other jobs' lines with it) away. Its lookups past the cap are still
/// decided, refused ones counted and noted; they are missing from the report.
pub const JOB_LINES_MAX: u32 = 10_000;

/// The line for a lookup of `name` at `unix`.
pub fn line(unix: u64, name: &str, refused: bool) -> String {
    format!("{unix} {} {}", u8::from(refused), normal(name))
}

/// A line read back: when, whether refused, the name. `None` for a line that is not one (a
/// torn last line after a crash, a hand edit).
pub fn parse(line: &str) -> Option<(u64, bool, &str)> {
    let mut parts = line.trim_end().splitn(3, ' ');
    let unix = parts.next()?.parse().ok()?;
    let refused = match parts.next()? {
        "0" => false,
        "1" => true,
        _ => return None,
    };
    let name = parts.next().filter(|n| !n.is_empty() && !n.contains(' '))?;
    Some((unix, refused, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_back_as_written_and_a_torn_one_is_skipped() {
        let l = line(1_700_000_000, "PasteBin.com.", true);
        assert_eq!(l, "1700000000 1 pastebin.com");
        assert_eq!(parse(&l), Some((1_700_000_000, true, "pastebin.com")));
        assert_eq!(
            parse("1700000000 0 github.com\n"),
            Some((1_700_000_000, false, "github.com"))
        );
        for bad in ["", "17000", "1700 2 x", "x 0 y", "1700 0 ", "1700 0 a b"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
