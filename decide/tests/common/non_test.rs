//! Source text without its test code, for the checks that read the source: the decision
//! crate's purity check (`decide/tests/tidy.rs`) and the module edges (`tests/it/docs.rs`).

/// `text` with its `#[cfg(test)]` items blanked, wherever they sit: the attribute and the item
/// after it (to its `;`, or to the brace that closes its body) become as many empty lines, so
/// what follows is read again at its own line number.
pub fn non_test(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (mut depth, mut end) = (0usize, item.len());
        for (i, c) in item.char_indices() {
            match c {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.extend(item[..end].matches('\n').map(|_| '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}
