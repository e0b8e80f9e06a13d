//! Aligned text tables for the CLI, the demo and the bench.

/// Formats `rows` under `headers`, each column padded to its widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| printable(cell)).collect())
        .collect();
    let rows = &rows;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let padded: Vec<String> = cells
            .zip(&widths)
            .map(|(c, w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    let rules: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
    line(&mut rules.iter().map(String::as_str));
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// `cell` with its control characters escaped (`\n`, `\u{1b}`): a value from the database
/// cannot move the cursor, recolour the terminal or fake a row.
fn printable(cell: &str) -> String {
    if !cell.chars().any(char::is_control) {
        return cell.to_string();
    }
    cell.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escapes_control_characters() {
        let out = super::render(&["id"], &[vec!["evt\u{1b}[2J\nfake".into()]]);
        assert_eq!(out, "id\n------------------\nevt\\u{1b}[2J\\nfake\n");
    }

    #[test]
    fn pads_columns() {
        let out = super::render(&["a", "bb"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(out, "a    bb\n---  --\nxyz  1\n");
    }
}
