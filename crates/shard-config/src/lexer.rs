//! Tokens and the directive tree of nginx's configuration syntax.
//!
//! The lexer follows `ngx_conf_read_token`: words, `;`, `{`, `}`, `#` comments (only where a
//! new token may start), single and double quotes, backslash escapes, `${var}` kept literal.
//! Syntax errors are not raised at once: the tree keeps every directive read before the
//! error and then an [`Item::Error`], so errors come out in file order, as nginx's do.

use crate::ConfigError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tok {
    Word(String),
    Semi,
    Open,
    Close,
    Eof,
}

pub(crate) struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    file: &'a str,
}

impl<'a> Lexer<'a> {
    pub(crate) fn new(text: &'a str, file: &'a str) -> Self {
        Lexer {
            src: text.as_bytes(),
            pos: 0,
            line: 1,
            file,
        }
    }

    fn err(&self, msg: String) -> ConfigError {
        ConfigError::at(self.file, self.line, msg)
    }

    fn eof_in_directive(&self) -> ConfigError {
        if crate::is_command_line(self.file) {
            self.err("unexpected end of parameter, expecting \";\"".into())
        } else {
            self.err("unexpected end of file, expecting \";\" or \"}\"".into())
        }
    }

    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.pos += 1;
        if c == b'\n' {
            self.line += 1;
        }
        Some(c)
    }

    /// The next token and the line it starts on.
    pub(crate) fn next_tok(&mut self) -> Result<(Tok, usize), ConfigError> {
        // Skip blanks and comments.
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\r' | b'\n') => {
                    self.bump();
                }
                Some(b'#') => {
                    while let Some(c) = self.peek() {
                        if c == b'\n' {
                            break;
                        }
                        self.bump();
                    }
                }
                _ => break,
            }
        }
        let line = self.line;
        let Some(c) = self.peek() else {
            return Ok((Tok::Eof, line));
        };
        match c {
            b';' => {
                self.bump();
                Ok((Tok::Semi, line))
            }
            b'{' => {
                self.bump();
                Ok((Tok::Open, line))
            }
            b'}' => {
                self.bump();
                Ok((Tok::Close, line))
            }
            b'"' | b'\'' => {
                self.bump();
                let start = self.pos;
                loop {
                    match self.bump() {
                        None => return Err(self.eof_in_directive()),
                        Some(b'\\') => {
                            if self.bump().is_none() {
                                return Err(self.eof_in_directive());
                            }
                        }
                        Some(q) if q == c => break,
                        Some(_) => {}
                    }
                }
                let raw = &self.src[start..self.pos - 1];
                // After a closing quote nginx wants a separator, or the `)` that closes an
                // `if` condition (`if ($a = "")`), which then starts the next word.
                match self.peek() {
                    None | Some(b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{' | b'}' | b')') => {}
                    Some(other) => {
                        let ch = self.rest_char(other);
                        return Err(self.err(format!("unexpected \"{ch}\"")));
                    }
                }
                Ok((Tok::Word(unescape(raw)), line))
            }
            _ => {
                let start = self.pos;
                let mut in_var_brace = false;
                while let Some(c) = self.peek() {
                    match c {
                        b'\\' => {
                            self.bump();
                            if self.peek().is_some() {
                                self.bump();
                            }
                            continue;
                        }
                        b'$' => {
                            self.bump();
                            if self.peek() == Some(b'{') {
                                self.bump();
                                in_var_brace = true;
                            }
                            continue;
                        }
                        b'}' if in_var_brace => {
                            in_var_brace = false;
                            self.bump();
                            continue;
                        }
                        b' ' | b'\t' | b'\r' | b'\n' | b';' | b'{' | b'}' => break,
                        _ => {
                            self.bump();
                        }
                    }
                }
                Ok((Tok::Word(unescape(&self.src[start..self.pos])), line))
            }
        }
    }

    fn rest_char(&self, first: u8) -> String {
        if first.is_ascii() {
            (first as char).to_string()
        } else {
            let rest = &self.src[self.pos..];
            String::from_utf8_lossy(&rest[..rest.len().min(4)])
                .chars()
                .next()
                .map(|c| c.to_string())
                .unwrap_or_default()
        }
    }
}

/// nginx's escapes: `\"`, `\'`, `\\`, `\t`, `\r`, `\n`; any other backslash stays.
fn unescape(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' && i + 1 < raw.len() {
            match raw[i + 1] {
                b'"' | b'\'' | b'\\' => {
                    out.push(raw[i + 1]);
                    i += 2;
                    continue;
                }
                b't' => {
                    out.push(b'\t');
                    i += 2;
                    continue;
                }
                b'r' => {
                    out.push(b'\r');
                    i += 2;
                    continue;
                }
                b'n' => {
                    out.push(b'\n');
                    i += 2;
                    continue;
                }
                _ => {}
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One directive: its name, arguments, the line of its name and, for blocks, its contents.
#[derive(Debug, Clone)]
pub(crate) struct Directive {
    pub name: String,
    pub args: Vec<String>,
    pub line: usize,
    pub block: Option<Vec<Item>>,
}

#[derive(Debug, Clone)]
pub(crate) enum Item {
    Dir(Directive),
    /// A syntax error at this point of the file; nothing follows it.
    Error(ConfigError),
}

/// Reads a whole file into a tree. Never fails outright: a syntax error becomes the last item
/// of the innermost open block.
pub(crate) fn parse_tree(text: &str, file: &str) -> Vec<Item> {
    let mut lx = Lexer::new(text, file);
    let (items, _) = parse_block(&mut lx, false);
    items
}

fn parse_block(lx: &mut Lexer<'_>, inside: bool) -> (Vec<Item>, bool) {
    let mut items = Vec::new();
    loop {
        let mut words: Vec<String> = Vec::new();
        let mut first_line = 0;
        loop {
            let (tok, line) = match lx.next_tok() {
                Ok(t) => t,
                Err(e) => {
                    items.push(Item::Error(e));
                    return (items, false);
                }
            };
            match tok {
                Tok::Word(w) => {
                    if words.is_empty() {
                        first_line = line;
                    }
                    words.push(w);
                }
                Tok::Semi => {
                    if words.is_empty() {
                        items.push(Item::Error(lx.err("unexpected \";\"".into())));
                        return (items, false);
                    }
                    let name = words.remove(0);
                    items.push(Item::Dir(Directive {
                        name,
                        args: words,
                        line: first_line,
                        block: None,
                    }));
                    break;
                }
                Tok::Open => {
                    if words.is_empty() {
                        items.push(Item::Error(lx.err("unexpected \"{\"".into())));
                        return (items, false);
                    }
                    let name = words.remove(0);
                    let (children, ok) = parse_block(lx, true);
                    items.push(Item::Dir(Directive {
                        name,
                        args: words,
                        line: first_line,
                        block: Some(children),
                    }));
                    if !ok {
                        return (items, false);
                    }
                    break;
                }
                Tok::Close => {
                    if !words.is_empty() || !inside {
                        items.push(Item::Error(lx.err("unexpected \"}\"".into())));
                        return (items, false);
                    }
                    return (items, true);
                }
                Tok::Eof => {
                    if !words.is_empty() {
                        items.push(Item::Error(lx.eof_in_directive()));
                        return (items, false);
                    }
                    if inside {
                        // nginx itself says `expecting "}"` here; shard's contract is the
                        // one message for every early end of file.
                        items.push(Item::Error(lx.eof_in_directive()));
                        return (items, false);
                    }
                    return (items, true);
                }
            }
        }
    }
}
