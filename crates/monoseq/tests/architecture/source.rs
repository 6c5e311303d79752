//! Rust source reduced to what the architecture rules look at: the code with comments and the
//! contents of string and character literals blanked (line structure kept), which lines belong
//! to test-only items, where each function starts and ends, and the integer constants a crate
//! names. A lexer, not a parser: it is enough for the rules, and fast.

/// One source file: its path for reports, its code (comments and literal contents blanked)
/// and, per line, whether the line belongs to a `#[cfg(test)]` item.
pub struct Source {
    pub path: String,
    pub lines: Vec<String>,
    pub test: Vec<bool>,
}

impl Source {
    /// Reads `text` as the file `path`.
    pub fn new(path: &str, text: &str) -> Source {
        let code = blank_comments_and_literals(text);
        let lines: Vec<String> = code.split('\n').map(str::to_owned).collect();
        let test = test_lines(&lines);
        Source {
            path: path.to_owned(),
            lines,
            test,
        }
    }

    /// The modules this file declares as `#[cfg(test)] mod name;`, kept in files of their own.
    pub fn test_module_files(&self) -> Vec<String> {
        let lines = &self.lines;
        let declared = (1..lines.len()).filter(|&i| lines[i - 1].trim() == "#[cfg(test)]");
        declared
            .filter_map(|i| {
                lines[i]
                    .trim()
                    .strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(str::to_owned)
            })
            .collect()
    }

    /// Marks the whole file test-only.
    pub fn mark_test(&mut self) {
        self.test.iter_mut().for_each(|t| *t = true);
    }

    /// The lines that are not test-only, numbered from 1.
    pub fn non_test_lines(&self) -> impl Iterator<Item = (usize, &str)> {
        self.lines
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.test[*i])
            .map(|(i, line)| (i + 1, line.as_str()))
    }
}

/// `text` with every comment and every string or character literal's content replaced by
/// spaces, newlines kept, so line numbers and brace structure stay those of the file.
fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let rest = &chars[i..];
        let skip = if rest.starts_with(&['/', '/']) {
            line_comment_len(rest)
        } else if rest.starts_with(&['/', '*']) {
            block_comment_len(rest)
        } else if let Some(len) = string_literal_len(rest, chars.get(i.wrapping_sub(1))) {
            len
        } else if rest[0] == '\'' {
            char_literal_len(rest).unwrap_or(0)
        } else {
            0
        };
        if skip == 0 {
            out.push(chars[i]);
            i += 1;
        } else {
            out.extend(
                rest[..skip]
                    .iter()
                    .map(|&c| if c == '\n' { '\n' } else { ' ' }),
            );
            i += skip;
        }
    }
    out
}

fn line_comment_len(rest: &[char]) -> usize {
    rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
}

/// A block comment's length, nested comments included.
fn block_comment_len(rest: &[char]) -> usize {
    let mut depth = 0;
    let mut i = 0;
    while i < rest.len() {
        if rest[i..].starts_with(&['/', '*']) {
            depth += 1;
            i += 2;
        } else if rest[i..].starts_with(&['*', '/']) {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    rest.len()
}

/// The length of a string literal starting here (`"…"`, `b"…"`, `r#"…"#`, `br"…"`), or
/// `None`. `before` is the preceding character: `r` or `b` ending an identifier is no prefix.
fn string_literal_len(rest: &[char], before: Option<&char>) -> Option<usize> {
    if before.is_some_and(|&c| c.is_alphanumeric() || c == '_') {
        return (rest[0] == '"').then(|| quoted_len(rest, 1));
    }
    let prefix = if rest.starts_with(&['b', 'r']) {
        2
    } else if rest[0] == 'r' || rest[0] == 'b' {
        1
    } else {
        0
    };
    let raw = rest[..prefix].contains(&'r');
    let hashes = rest[prefix..].iter().take_while(|&&c| c == '#').count();
    if !raw && hashes > 0 {
        return None;
    }
    let open = prefix + hashes;
    if rest.get(open) != Some(&'"') {
        return None;
    }
    if !raw {
        return Some(quoted_len(rest, open + 1));
    }
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let end = (open + 1..rest.len()).find(|&j| rest[j..].starts_with(&close));
    Some(end.map_or(rest.len(), |j| j + close.len()))
}

/// The length up to and including the closing quote of a non-raw string whose content starts
/// at `from`.
fn quoted_len(rest: &[char], from: usize) -> usize {
    let mut i = from;
    while i < rest.len() {
        match rest[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    rest.len()
}

/// The length of a character literal starting here, or `None` for a lifetime or label.
fn char_literal_len(rest: &[char]) -> Option<usize> {
    if rest.get(1) == Some(&'\\') {
        let close = rest.iter().skip(2).position(|&c| c == '\'')?;
        return Some(close + 3);
    }
    (rest.get(2) == Some(&'\'')).then_some(3)
}

/// Per line, whether it belongs to an item marked `#[cfg(test)]` (the attribute, the item's
/// signature and its body).
fn test_lines(lines: &[String]) -> Vec<bool> {
    let mut test = vec![false; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let end = item_end(lines, i + 1).unwrap_or(lines.len() - 1);
            test[i..=end].iter_mut().for_each(|t| *t = true);
            i = end + 1;
        } else {
            i += 1;
        }
    }
    test
}

/// The line on which the item starting at line `from` ends: its `;` before any `{`, or the `}`
/// closing its first `{`. Brackets and parentheses hide a `;` (as in `[u8; 4]`).
pub fn item_end(lines: &[String], from: usize) -> Option<usize> {
    let mut nesting = 0i32;
    let mut braces = 0i32;
    let mut opened = false;
    for (n, line) in lines.iter().enumerate().skip(from) {
        for c in line.chars() {
            match c {
                '(' | '[' => nesting += 1,
                ')' | ']' => nesting -= 1,
                ';' if !opened && nesting == 0 => return Some(n),
                '{' => {
                    opened = true;
                    braces += 1;
                }
                '}' => {
                    braces -= 1;
                    if opened && braces == 0 {
                        return Some(n);
                    }
                }
                _ => {}
            }
        }
    }
    None
}

/// A function with a body: its name and its first and last line (from 1).
pub struct Function {
    pub name: String,
    pub first: usize,
    pub last: usize,
}

impl Function {
    pub fn lines(&self) -> usize {
        self.last - self.first + 1
    }
}

/// Every function with a body in the non-test code of `source`, nested ones included.
pub fn functions(source: &Source) -> Vec<Function> {
    let mut found = Vec::new();
    for (n, line) in source.lines.iter().enumerate() {
        if source.test[n] {
            continue;
        }
        let Some(name) = fn_name(line) else { continue };
        let Some(end) = item_end(&source.lines, n) else {
            continue;
        };
        if body_opens(&source.lines, n, end) {
            found.push(Function {
                name,
                first: n + 1,
                last: end + 1,
            });
        }
    }
    found
}

/// The name of the function declared on `line`, if one is.
fn fn_name(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(at) = line[from..].find("fn ").map(|p| p + from) {
        let starts_word =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let name: String = line[at + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if starts_word && !name.is_empty() {
            return Some(name);
        }
        from = at + 3;
    }
    None
}

/// Whether the item spanning lines `first..=last` has a body (it ends with `}`, not `;`).
fn body_opens(lines: &[String], first: usize, last: usize) -> bool {
    lines[first..=last].iter().any(|line| line.contains('{'))
        && lines[last].trim_end().ends_with('}')
}

/// An integer constant: `const NAME: <integer type> = <integer literal>;` on one line.
pub struct Constant {
    pub name: String,
    pub value: u128,
}

const INTEGER_TYPES: &[&str] = &[
    "u8", "u16", "u32", "u64", "u128", "usize", "i8", "i16", "i32", "i64", "i128", "isize",
];

/// The integer constants defined by a bare literal in the non-test code of `source`.
pub fn constants(source: &Source) -> Vec<Constant> {
    source
        .non_test_lines()
        .filter_map(|(_, line)| constant(line))
        .collect()
}

fn constant(line: &str) -> Option<Constant> {
    let after = line.split_once("const ")?.1;
    let (name, rest) = after.split_once(':')?;
    let (ty, value) = rest.split_once('=')?;
    let value = value.trim().strip_suffix(';')?.trim();
    if !INTEGER_TYPES.contains(&ty.trim()) {
        return None;
    }
    Some(Constant {
        name: name.trim().to_owned(),
        value: integer_value(value)?,
    })
}

/// The value of an integer literal (`4096`, `64_000`, `0x10`, `8u32`), or `None`.
pub fn integer_value(literal: &str) -> Option<u128> {
    let digits: String = literal.chars().filter(|&c| c != '_').collect();
    let digits = INTEGER_TYPES
        .iter()
        .find_map(|ty| digits.strip_suffix(ty))
        .unwrap_or(&digits);
    let (radix, digits) = match digits.get(..2) {
        Some("0x") => (16, &digits[2..]),
        Some("0o") => (8, &digits[2..]),
        Some("0b") => (2, &digits[2..]),
        _ => (10, digits),
    };
    u128::from_str_radix(digits, radix).ok()
}

/// The integer literals on a line of code: (value, text). A number after `.` (a tuple field,
/// a float's fraction) or before `.digit` / `e` (a float) is none.
pub fn integer_literals(line: &str) -> Vec<(u128, String)> {
    let bytes = line.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let after_word = i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if !bytes[i].is_ascii_digit() || after_word {
            i += 1;
            continue;
        }
        let end = (i..bytes.len())
            .find(|&j| !(bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_'))
            .unwrap_or(bytes.len());
        let text = &line[i..end];
        let after_dot = i > 0 && bytes[i - 1] == b'.';
        let float =
            bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit);
        if let (false, false, Some(value)) = (after_dot, float, integer_value(text)) {
            found.push((value, text.to_owned()));
        }
        i = end;
    }
    found
}

/// Whether `line` is part of a `const` or `static` definition's first line.
pub fn defines_constant(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().take(3).collect();
    words.iter().any(|w| *w == "const" || *w == "static")
        && !words.contains(&"fn")
        && !line.contains("const fn")
}
