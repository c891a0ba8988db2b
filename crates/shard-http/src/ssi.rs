//! Server Side Includes (`ngx_http_ssi_module`) without I/O: the command parser, the
//! strings with variables that commands take, `echo`'s encodings, and `if`'s expressions
//! split into their sides.
//!
//! The parser is fed a document in pieces of any size: text goes out as it comes (all but a
//! possible command's opening, held until it is decided), and it stops after each command
//! (`<!--#name param="value" ... -->`) so that the caller runs it before anything after it.
//! What a command does (variables, subrequests, the output's state) is the caller's
//! (`shard_server`'s worker); nginx's parse errors are here, with nginx's messages.

/// The longest command name and parameter name (nginx's `NGX_HTTP_SSI_COMMAND_LEN`,
/// `NGX_HTTP_SSI_PARAM_LEN`).
pub const COMMAND_LEN: usize = 32;
pub const PARAM_LEN: usize = 32;
/// The most parameters a command takes (nginx's `NGX_HTTP_SSI_MAX_PARAMS`).
pub const MAX_PARAMS: usize = 16;
/// nginx's default `config errmsg`.
pub const ERRMSG: &[u8] = b"[an error occurred while processing the directive]";
/// nginx's default `config timefmt`.
pub const TIMEFMT: &str = "%A, %d-%b-%Y %H:%M:%S %Z";

/// One parsed command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub name: String,
    pub params: Vec<(String, Vec<u8>)>,
}

impl Command {
    /// The value of parameter `name` (the first, should it repeat).
    pub fn param(&self, name: &str) -> Option<&[u8]> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// What one [`Parser::feed`] ends with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A whole command: run it before feeding more.
    Command(Command),
    /// A command that could not be parsed (nginx's message): its error is written in its
    /// place.
    Error(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// `<`, `<!`, `<!-`, `<!--` seen (the count of bytes matched).
    Open(u8),
    PreCommand,
    Name,
    PreParam,
    Param,
    PreEqual,
    PreValue,
    Value(u8),
    Escaped(u8),
    PostParam,
    End0,
    End1,
    /// A bad command: skipped to its `-->`.
    Error,
    Error0,
    Error1,
}

/// The incremental parser of one document.
#[derive(Debug)]
pub struct Parser {
    state: State,
    /// The longest parameter value (`ssi_value_length`).
    value_max: usize,
    name: String,
    params: Vec<(String, Vec<u8>)>,
    error: Option<String>,
}

impl Parser {
    pub fn new(value_max: usize) -> Parser {
        Parser {
            state: State::Text,
            value_max: value_max.max(1),
            name: String::new(),
            params: Vec::new(),
            error: None,
        }
    }

    /// Whether the document ended inside a command (its bytes were never text).
    pub fn in_command(&self) -> bool {
        !matches!(self.state, State::Text | State::Open(_))
    }

    /// Parses `input`: its text is appended to `text`, and the parser stops after the first
    /// command or command error. Returns the bytes of `input` taken.
    pub fn feed(&mut self, input: &[u8], text: &mut Vec<u8>) -> (usize, Option<Item>) {
        const OPEN: &[u8] = b"<!--#";
        let mut i = 0;
        while i < input.len() {
            let ch = input[i];
            i += 1;
            match self.state {
                State::Text => {
                    // Copy up to the next `<` at once.
                    let from = i - 1;
                    let next =
                        memchr::memchr(b'<', &input[from..]).map_or(input.len(), |n| from + n);
                    text.extend_from_slice(&input[from..next]);
                    i = next;
                    if next < input.len() {
                        i += 1;
                        self.state = State::Open(1);
                    }
                }
                State::Open(n) => {
                    if ch == OPEN[n as usize] {
                        self.state = if n + 1 == OPEN.len() as u8 {
                            State::PreCommand
                        } else {
                            State::Open(n + 1)
                        };
                    } else {
                        // Not a command: what was held is text; a `<` may open one.
                        text.extend_from_slice(&OPEN[..n as usize]);
                        if ch == b'<' {
                            self.state = State::Open(1);
                        } else {
                            text.push(ch);
                            self.state = State::Text;
                        }
                    }
                }
                State::PreCommand => {
                    if !is_space(ch) {
                        self.name.clear();
                        self.params.clear();
                        self.error = None;
                        self.name.push(ch as char);
                        self.state = State::Name;
                    }
                }
                State::Name => match ch {
                    _ if is_space(ch) => self.state = State::PreParam,
                    b'-' => self.state = State::End0,
                    _ if self.name.len() == COMMAND_LEN => {
                        self.fail(format!(
                            "the \"{}{}...\" SSI command is too long",
                            self.name, ch as char
                        ));
                    }
                    _ => self.name.push(ch as char),
                },
                State::PreParam => match ch {
                    _ if is_space(ch) => {}
                    b'-' => self.state = State::End0,
                    _ => {
                        if self.params.len() == MAX_PARAMS {
                            self.fail(format!(
                                "too many SSI command parameters: \"{}\"",
                                self.name
                            ));
                        } else {
                            self.params.push(((ch as char).to_string(), Vec::new()));
                            self.state = State::Param;
                        }
                    }
                },
                State::Param => match ch {
                    _ if is_space(ch) => self.state = State::PreEqual,
                    b'=' => self.state = State::PreValue,
                    b'-' => {
                        let msg = format!(
                            "unexpected \"-\" symbol after \"{}\" parameter in \"{}\" SSI command",
                            self.key(),
                            self.name
                        );
                        self.fail(msg);
                        self.state = State::Error0;
                    }
                    _ if self.key().len() == PARAM_LEN => {
                        let msg = format!(
                            "too long \"{}{}...\" parameter in \"{}\" SSI command",
                            self.key(),
                            ch as char,
                            self.name
                        );
                        self.fail(msg);
                    }
                    _ => self.last().0.push(ch as char),
                },
                State::PreEqual => match ch {
                    _ if is_space(ch) => {}
                    b'=' => self.state = State::PreValue,
                    _ => self.unexpected(ch, "after"),
                },
                State::PreValue => match ch {
                    _ if is_space(ch) => {}
                    b'"' | b'\'' => self.state = State::Value(ch),
                    _ => self.unexpected(ch, "before value of"),
                },
                State::Value(q) | State::Escaped(q) => {
                    let escaped = matches!(self.state, State::Escaped(_));
                    if !escaped && ch == q {
                        self.state = State::PostParam;
                        continue;
                    }
                    if self.last().1.len() == self.value_max {
                        let (k, v) = self.last().clone();
                        let msg = format!(
                            "too long \"{}{}...\" value of \"{}\" parameter in \"{}\" SSI command",
                            String::from_utf8_lossy(&v),
                            ch as char,
                            k,
                            self.name
                        );
                        self.fail(msg);
                        continue;
                    }
                    // A backslash stays, with the byte after it (`evaluate` reads them).
                    self.last().1.push(ch);
                    self.state = if !escaped && ch == b'\\' {
                        State::Escaped(q)
                    } else {
                        State::Value(q)
                    };
                }
                State::PostParam => match ch {
                    _ if is_space(ch) => self.state = State::PreParam,
                    b'-' => self.state = State::End0,
                    _ => {
                        let msg = format!(
                            "unexpected \"{}\" symbol after \"{}\" parameter in \"{}\" SSI command",
                            ch as char,
                            self.key(),
                            self.name
                        );
                        self.fail(msg);
                        if ch == b'-' {
                            self.state = State::Error0;
                        }
                    }
                },
                State::End0 => {
                    if ch == b'-' {
                        self.state = State::End1;
                    } else {
                        let msg = format!(
                            "unexpected \"{}\" symbol in \"{}\" SSI command",
                            ch as char, self.name
                        );
                        self.fail(msg);
                    }
                }
                State::End1 => {
                    if ch == b'>' {
                        self.state = State::Text;
                        let cmd = Command {
                            name: std::mem::take(&mut self.name),
                            params: std::mem::take(&mut self.params),
                        };
                        return (i, Some(Item::Command(cmd)));
                    }
                    let msg = format!(
                        "unexpected \"{}\" symbol in \"{}\" SSI command",
                        ch as char, self.name
                    );
                    self.fail(msg);
                }
                State::Error => {
                    if ch == b'-' {
                        self.state = State::Error0;
                    }
                }
                State::Error0 => {
                    self.state = if ch == b'-' {
                        State::Error1
                    } else {
                        State::Error
                    };
                }
                State::Error1 => match ch {
                    b'>' => {
                        self.state = State::Text;
                        let msg = self.error.take().unwrap_or_default();
                        return (i, Some(Item::Error(msg)));
                    }
                    b'-' => {}
                    _ => self.state = State::Error,
                },
            }
        }
        (i, None)
    }

    /// The document ended: a command's opening held back is text after all.
    pub fn finish(&mut self, text: &mut Vec<u8>) {
        if let State::Open(n) = self.state {
            text.extend_from_slice(&b"<!--#"[..n as usize]);
        }
        self.state = State::Text;
    }

    fn key(&self) -> &str {
        self.params.last().map_or("", |p| p.0.as_str())
    }

    fn last(&mut self) -> &mut (String, Vec<u8>) {
        if self.params.is_empty() {
            self.params.push((String::new(), Vec::new()));
        }
        let n = self.params.len() - 1;
        &mut self.params[n]
    }

    fn fail(&mut self, msg: String) {
        if self.error.is_none() {
            self.error = Some(msg);
        }
        self.state = State::Error;
    }

    fn unexpected(&mut self, ch: u8, place: &str) {
        let msg = format!(
            "unexpected \"{}\" symbol {} \"{}\" parameter in \"{}\" SSI command",
            ch as char,
            place,
            self.key(),
            self.name
        );
        self.fail(msg);
        if ch == b'-' {
            self.state = State::Error0;
        }
    }
}

fn is_space(ch: u8) -> bool {
    matches!(ch, b' ' | b'\t' | b'\r' | b'\n')
}

/// A part of a command's string: bytes as they are, or a variable to look up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Text(Vec<u8>),
    Var(String),
}

/// A parameter value as nginx's `ngx_http_ssi_evaluate_string` reads it: `$name` and
/// `${name}` are variables, a backslash takes the `\`, `'`, `"` or `$` after it literally (and
/// stays before any other byte). Err: nginx's message.
pub fn segments(text: &[u8]) -> Result<Vec<Seg>, String> {
    let mut out = Vec::new();
    let mut lit = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let ch = text[i];
        if ch == b'\\' && i + 1 < text.len() {
            let next = text[i + 1];
            if !matches!(next, b'\\' | b'\'' | b'"' | b'$') {
                lit.push(b'\\');
            }
            lit.push(next);
            i += 2;
            continue;
        }
        if ch != b'$' {
            lit.push(ch);
            i += 1;
            continue;
        }
        i += 1;
        let bracket = text.get(i) == Some(&b'{');
        if bracket {
            i += 1;
        }
        let start = i;
        while i < text.len() && (text[i].is_ascii_alphanumeric() || text[i] == b'_') {
            i += 1;
        }
        let name = String::from_utf8_lossy(&text[start..i]).into_owned();
        if bracket {
            if text.get(i) != Some(&b'}') {
                return Err(format!(
                    "the closing bracket in \"{name}\" variable is missing"
                ));
            }
            i += 1;
        }
        if name.is_empty() {
            return Err(format!(
                "invalid variable name in \"{}\"",
                String::from_utf8_lossy(text)
            ));
        }
        if !lit.is_empty() {
            out.push(Seg::Text(std::mem::take(&mut lit)));
        }
        out.push(Seg::Var(name.to_ascii_lowercase()));
    }
    if !lit.is_empty() {
        out.push(Seg::Text(lit));
    }
    Ok(out)
}

/// `echo`'s `encoding="entity"` (its default): nginx's `ngx_escape_html`.
pub fn escape_entity(v: &[u8], out: &mut Vec<u8>) {
    for &b in v {
        match b {
            b'<' => out.extend_from_slice(b"&lt;"),
            b'>' => out.extend_from_slice(b"&gt;"),
            b'&' => out.extend_from_slice(b"&amp;"),
            b'"' => out.extend_from_slice(b"&quot;"),
            _ => out.push(b),
        }
    }
}

/// `echo`'s `encoding="url"`: nginx's `ngx_escape_uri` with its `html` table.
pub fn escape_url(v: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in v {
        let escape = !(0x20..0x7f).contains(&b)
            || matches!(
                b,
                b' ' | b'"'
                    | b'#'
                    | b'%'
                    | b'\''
                    | b'<'
                    | b'>'
                    | b'\\'
                    | b'^'
                    | b'`'
                    | b'{'
                    | b'|'
                    | b'}'
            );
        if escape {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        } else {
            out.push(b);
        }
    }
}

/// An `if`/`elif` expression (`expr="..."`) split as nginx reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// `$var` alone: true when not empty.
    Value(Vec<u8>),
    /// `left = right`, `left != right` (negated), the right a regular expression when
    /// written `/.../`.
    Compare {
        left: Vec<u8>,
        negated: bool,
        right: Vec<u8>,
        regex: bool,
    },
}

/// Splits `expr` (nginx's `ngx_http_ssi_if`): the left side is the leading run of letters,
/// digits, `$ { } _ " '`; then `=` or `!=` and the rest, `/.../` for a regex (a `\/` at its
/// start keeps a literal slash). Err: nginx's message.
pub fn parse_expr(expr: &[u8]) -> Result<Expr, String> {
    let invalid = || {
        format!(
            "invalid expression in \"{}\"",
            String::from_utf8_lossy(expr)
        )
    };
    let mut p = 0;
    while p < expr.len()
        && (expr[p].is_ascii_alphanumeric()
            || matches!(expr[p], b'$' | b'{' | b'}' | b'_' | b'"' | b'\''))
    {
        p += 1;
    }
    // nginx lowers the left side's letters in place (variable names are case-blind).
    let left = expr[..p].to_ascii_lowercase();
    while p < expr.len() && expr[p] == b' ' {
        p += 1;
    }
    if p == expr.len() {
        return Ok(Expr::Value(left));
    }
    let negated = if expr[p] == b'=' {
        p += 1;
        false
    } else if expr[p] == b'!' && expr.get(p + 1) == Some(&b'=') {
        p += 2;
        true
    } else {
        return Err(invalid());
    };
    while p < expr.len() && expr[p] == b' ' {
        p += 1;
    }
    let mut last = expr.len();
    let regex = p + 1 < last && expr[p] == b'/';
    if regex {
        if expr[last - 1] != b'/' {
            return Err(invalid());
        }
        last -= 1;
        p += 1;
    } else if p + 1 < last && expr[p] == b'\\' && expr[p + 1] == b'/' {
        p += 1;
    }
    Ok(Expr::Compare {
        left,
        negated,
        right: expr[p..last].to_vec(),
        regex,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(doc: &[u8], piece: usize) -> (Vec<u8>, Vec<Item>) {
        let mut p = Parser::new(256);
        let mut text = Vec::new();
        let mut items = Vec::new();
        for chunk in doc.chunks(piece.max(1)) {
            let mut at = 0;
            while at < chunk.len() {
                let (n, item) = p.feed(&chunk[at..], &mut text);
                at += n;
                if let Some(it) = item {
                    text.extend_from_slice(b"@");
                    items.push(it);
                }
            }
        }
        p.finish(&mut text);
        (text, items)
    }

    #[test]
    fn commands_are_cut_out_of_text_whatever_the_pieces() {
        let doc = b"a<b <!-- c --> <!--#echo var=\"x\" -->d<!--#include virtual='/y?a=1' wait=\"yes\"-->e<!";
        for piece in [1, 2, 3, 7, 1000] {
            let (text, items) = parse_all(doc, piece);
            assert_eq!(text, b"a<b <!-- c --> @d@e<!", "piece {piece}");
            assert_eq!(
                items,
                vec![
                    Item::Command(Command {
                        name: "echo".into(),
                        params: vec![("var".into(), b"x".to_vec())]
                    }),
                    Item::Command(Command {
                        name: "include".into(),
                        params: vec![
                            ("virtual".into(), b"/y?a=1".to_vec()),
                            ("wait".into(), b"yes".to_vec())
                        ]
                    }),
                ]
            );
        }
    }

    #[test]
    fn a_command_without_parameters_and_spaces_before_its_name() {
        let (text, items) = parse_all(b"<!--# endif -->x<!--#else-->", 1000);
        assert_eq!(text, b"@x@");
        assert!(matches!(&items[0], Item::Command(c) if c.name == "endif" && c.params.is_empty()));
        assert!(matches!(&items[1], Item::Command(c) if c.name == "else"));
    }

    #[test]
    fn bad_commands_are_errors_skipped_to_their_end() {
        let (text, items) = parse_all(b"a<!--#echo var=x -->b<!--#echo var=\"toolong\" -->c", 1000);
        assert_eq!(text, b"a@b@c");
        assert!(
            matches!(&items[0], Item::Error(m) if m.contains("unexpected \"x\" symbol before value of \"var\""))
        );
        assert!(matches!(&items[1], Item::Command(_)));
        let mut p = Parser::new(3);
        let mut t = Vec::new();
        let (_, item) = p.feed(b"<!--#echo var=\"long\" -->", &mut t);
        assert!(matches!(item, Some(Item::Error(m)) if m.contains("too long \"lon")));
    }

    #[test]
    fn backslashes_stay_in_values_and_segments_read_them() {
        let (_, items) = parse_all(br#"<!--#set var="v" value="a\"b\$c\nd $x${y}z" -->"#, 1000);
        let Item::Command(c) = &items[0] else {
            panic!("{items:?}")
        };
        let v = c.param("value").unwrap();
        assert_eq!(v, br#"a\"b\$c\nd $x${y}z"#);
        assert_eq!(
            segments(v).unwrap(),
            vec![
                Seg::Text(br#"a"b$c\nd "#.to_vec()),
                Seg::Var("x".into()),
                Seg::Var("y".into()),
                Seg::Text(b"z".to_vec())
            ]
        );
        assert!(segments(b"${x").is_err());
        assert!(segments(b"a $ b").is_err());
    }

    #[test]
    fn expressions_split_as_nginx() {
        assert_eq!(
            parse_expr(b"$arg_v").unwrap(),
            Expr::Value(b"$arg_v".to_vec())
        );
        assert_eq!(
            parse_expr(b"$Arg_v = /re+gexp?/").unwrap(),
            Expr::Compare {
                left: b"$arg_v".to_vec(),
                negated: false,
                right: b"re+gexp?".to_vec(),
                regex: true
            }
        );
        assert_eq!(
            parse_expr(b"equal != $arg_v").unwrap(),
            Expr::Compare {
                left: b"equal".to_vec(),
                negated: true,
                right: b"$arg_v".to_vec(),
                regex: false
            }
        );
        assert!(parse_expr(b"$a < b").is_err());
        assert!(parse_expr(b"$a = /x").is_err());
    }

    #[test]
    fn encodings_as_nginx() {
        let mut o = Vec::new();
        escape_entity(b"<a&\"b'>", &mut o);
        assert_eq!(o, b"&lt;a&amp;&quot;b'&gt;");
        o.clear();
        escape_url(b"<t e>?&/", &mut o);
        assert_eq!(o, b"%3Ct%20e%3E?&/");
    }
}
