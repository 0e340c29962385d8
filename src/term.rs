//! What the CLI prints, made safe for a terminal.
//!
//! Job names, workflows, branches, repositories and error texts come from webhooks and
//! servers: a name can carry escape sequences that recolour the terminal, set its window title,
//! clear the screen or, on some terminals, answer back into its input. Every control character
//! (C0, DEL, C1) and every bidirectional override is printed as a visible `\u{..}` instead.
//! [`one_line`] is for a single value (a line end in it is escaped too, so a name cannot forge
//! a line of the report); [`printable`] is for a whole report (its own line ends and tabs stay).

use std::borrow::Cow;

/// Whether `c` may not reach a terminal as it is.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escaped(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| unsafe_char(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) && !keep(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One value: every control character escaped, line ends included.
pub fn one_line(s: &str) -> Cow<'_, str> {
    escaped(s, |_| false)
}

/// A whole report: every control character escaped but its line ends and tabs.
pub fn printable(s: &str) -> Cow<'_, str> {
    escaped(s, |c| c == '\n' || c == '\t')
}

/// `println!` through [`printable`].
macro_rules! outln {
    ($($arg:tt)*) => {
        println!("{}", $crate::term::printable(&format!($($arg)*)))
    };
}
pub(crate) use outln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_colours_titles_and_overrides_never_reach_the_terminal() {
        let name = "build\x1b[31m red\x1b]0;owned\x07\x1b[2J\u{9b}x\u{202e}gnp.exe";
        let shown = one_line(name);
        assert!(!shown.chars().any(unsafe_char), "{shown}");
        assert!(
            shown.contains("\\u{1b}[31m") && shown.contains("\\u{202e}"),
            "{shown}"
        );
        assert_eq!(one_line("a\nb"), "a\\u{a}b");
        assert_eq!(printable("a\tb\nc\x1b"), "a\tb\nc\\u{1b}");
        assert!(matches!(one_line("plain, ünïcode"), Cow::Borrowed(_)));
    }
}
