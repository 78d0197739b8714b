//! Reading an action out of a model's text: the last bracketed list, as PettingLLMs' agents
//! write it after `####` (`#### ["U", "R", "R"]`), quoted or bare (`[U, R, R]`), flat (moves) or
//! nested (a Sudoku grid or fill steps). A malformed answer is a [`ParseError`] that the
//! environment turns into the format penalty, never a panic.

use std::fmt;

/// Items beyond this many are refused rather than simulated (a runaway generation).
pub const MAX_ITEMS: usize = 256;

/// One move on a grid: up, down, left, right. Rows grow downwards, columns to the right.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Move {
    U,
    D,
    L,
    R,
}

impl Move {
    pub const ALL: [Move; 4] = [Move::U, Move::D, Move::L, Move::R];

    /// (row, column) offset.
    pub fn delta(self) -> (i32, i32) {
        match self {
            Move::U => (-1, 0),
            Move::D => (1, 0),
            Move::L => (0, -1),
            Move::R => (0, 1),
        }
    }

    pub fn letter(self) -> char {
        match self {
            Move::U => 'U',
            Move::D => 'D',
            Move::L => 'L',
            Move::R => 'R',
        }
    }

    /// `U`, `d`, `"L"`, `up`, `Right`…: one move, or `None`.
    pub fn parse(item: &str) -> Option<Move> {
        match item.to_ascii_lowercase().as_str() {
            "u" | "up" => Some(Move::U),
            "d" | "down" => Some(Move::D),
            "l" | "left" => Some(Move::L),
            "r" | "right" => Some(Move::R),
            _ => None,
        }
    }
}

/// A list of moves written the way the prompts ask for it: `["U", "R"]`.
pub fn format_moves(moves: &[Move]) -> String {
    let items: Vec<String> = moves.iter().map(|m| format!("\"{}\"", m.letter())).collect();
    format!("[{}]", items.join(", "))
}

/// Why an answer could not be read; the environment gives the format penalty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError(pub String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A parsed list: items are bare words/numbers, or lists themselves.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Atom(String),
    List(Vec<Item>),
}

/// The text the answer is read from: what follows the last `####`, else the whole output.
fn answer_part(text: &str) -> &str {
    match text.rfind("####") {
        Some(i) => &text[i + 4..],
        None => text,
    }
}

/// The last top-level bracketed list of the answer part, parsed.
pub fn last_list(text: &str) -> Result<Vec<Item>, ParseError> {
    let part = answer_part(text);
    let bytes = part.as_bytes();
    // The last `]` that closes a top-level list, and its opening `[`.
    let end = part.rfind(']').ok_or_else(|| ParseError("no [...] list in the answer".into()))?;
    let mut depth = 0usize;
    let mut start = None;
    for i in (0..=end).rev() {
        match bytes[i] {
            b']' => depth += 1,
            b'[' => {
                depth -= 1;
                if depth == 0 {
                    start = Some(i);
                    break;
                }
            }
            _ => {}
        }
    }
    let start = start.ok_or_else(|| ParseError("unbalanced brackets in the answer".into()))?;
    let mut parser = Parser { s: &part[start..=end], pos: 0, items: 0 };
    match parser.item()? {
        Item::List(items) => Ok(items),
        Item::Atom(_) => Err(ParseError("the answer is not a list".into())),
    }
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
    items: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if !c.is_whitespace() {
                break;
            }
            self.pos += c.len_utf8();
        }
    }

    fn item(&mut self) -> Result<Item, ParseError> {
        self.skip_space();
        self.items += 1;
        if self.items > MAX_ITEMS * 8 {
            return Err(ParseError(format!("the answer has more than {MAX_ITEMS} items")));
        }
        match self.peek() {
            Some('[') => {
                self.pos += 1;
                let mut items = Vec::new();
                self.skip_space();
                if self.peek() == Some(']') {
                    self.pos += 1;
                    return Ok(Item::List(items));
                }
                loop {
                    items.push(self.item()?);
                    if items.len() > MAX_ITEMS {
                        return Err(ParseError(format!("the answer has more than {MAX_ITEMS} items")));
                    }
                    self.skip_space();
                    match self.peek() {
                        Some(',') => self.pos += 1,
                        Some(']') => {
                            self.pos += 1;
                            return Ok(Item::List(items));
                        }
                        _ => return Err(ParseError("expected , or ] in the list".into())),
                    }
                }
            }
            Some(q @ ('"' | '\'')) => {
                self.pos += 1;
                let rest = &self.s[self.pos..];
                let len = rest.find(q).ok_or_else(|| ParseError("unterminated quote in the list".into()))?;
                let atom = rest[..len].trim().to_string();
                self.pos += len + 1;
                Ok(Item::Atom(atom))
            }
            Some(_) => {
                let rest = &self.s[self.pos..];
                let len = rest.find([',', ']', '[']).unwrap_or(rest.len());
                let atom = rest[..len].trim();
                if atom.is_empty() {
                    return Err(ParseError("an empty item in the list".into()));
                }
                self.pos += len;
                Ok(Item::Atom(atom.to_string()))
            }
            None => Err(ParseError("the list ends early".into())),
        }
    }
}

/// The words of a bare atom: `[U R R]` is read as `[U, R, R]`.
fn words(atom: &str) -> impl Iterator<Item = &str> {
    atom.split_whitespace()
}

/// The moves of an answer: `#### ["U", "R"]`, `[U, R]`, `[U R]`, `['up', 'right']`.
pub fn parse_moves(text: &str) -> Result<Vec<Move>, ParseError> {
    let mut moves = Vec::new();
    for item in last_list(text)? {
        let Item::Atom(a) = item else { return Err(ParseError("a move list holds letters, not lists".into())) };
        for w in words(&a) {
            moves.push(Move::parse(w).ok_or_else(|| ParseError(format!("{w:?} is not a move (U, D, L or R)")))?);
        }
        if moves.len() > MAX_ITEMS {
            return Err(ParseError(format!("the answer has more than {MAX_ITEMS} items")));
        }
    }
    Ok(moves)
}

/// Integers of a nested list, row by row: `[[1,2],[3,4]]` → `[[1,2],[3,4]]`.
pub fn parse_int_rows(text: &str) -> Result<Vec<Vec<i64>>, ParseError> {
    last_list(text)?
        .iter()
        .map(|row| match row {
            Item::List(cells) => {
                let mut row = Vec::new();
                for c in cells {
                    let Item::Atom(a) = c else { return Err(ParseError("lists nested too deep".into())) };
                    for w in words(a) {
                        row.push(w.parse::<i64>().map_err(|_| ParseError(format!("{w:?} is not a whole number")))?);
                    }
                }
                Ok(row)
            }
            Item::Atom(a) => Err(ParseError(format!("expected a list of rows, found {a:?}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_are_read_from_the_last_list_after_the_marker() {
        use Move::*;
        assert_eq!(parse_moves("I go right then down.\n#### [\"R\", \"D\"]"), Ok(vec![R, D]));
        assert_eq!(parse_moves("#### [U, l, 'down', Right]"), Ok(vec![U, L, D, R]));
        assert_eq!(parse_moves("first [\"U\"] then better [\"D\"]"), Ok(vec![D]));
        assert_eq!(parse_moves("#### []"), Ok(vec![]));
        // Text after the list does not hide it (PettingLLMs' regex returned None here).
        assert_eq!(parse_moves("#### [\"L\"] done"), Ok(vec![L]));
        // Bare letters may be separated by spaces as well as commas.
        assert_eq!(parse_moves("[R R, d]"), Ok(vec![R, R, D]));
    }

    #[test]
    fn malformed_answers_are_errors_not_panics() {
        for bad in [
            "",
            "no list here",
            "#### [\"U\", \"X\"]",
            "#### [\"U\"",
            "#### U, R ]",
            "#### [\"U\", , \"R\"]",
            "#### [[\"U\"]]",
            "#### [\"U]",
            "]]]]",
            "[[[[",
            "#### [é, ü]",
            "####",
        ] {
            assert!(parse_moves(bad).is_err(), "{bad:?} parsed");
        }
        let long = format!("[{}]", vec!["U"; MAX_ITEMS + 1].join(","));
        assert!(parse_moves(&long).unwrap_err().0.contains("more than"));
    }

    #[test]
    fn grids_and_fill_steps_are_rows_of_integers() {
        assert_eq!(parse_int_rows("#### [[1,2],[3, 4]]"), Ok(vec![vec![1, 2], vec![3, 4]]));
        assert_eq!(parse_int_rows("[[0,1,2]]"), Ok(vec![vec![0, 1, 2]]));
        assert_eq!(parse_int_rows("[[1 2], [3 4]]"), Ok(vec![vec![1, 2], vec![3, 4]]));
        assert!(parse_int_rows("[[1,x]]").is_err());
        assert!(parse_int_rows("[1,2]").is_err());
        assert!(parse_int_rows("[[[1]]]").is_err());
    }

    #[test]
    fn the_prompt_format_round_trips() {
        let moves = vec![Move::U, Move::R, Move::D, Move::L];
        assert_eq!(parse_moves(&format!("#### {}", format_moves(&moves))), Ok(moves));
    }
}
