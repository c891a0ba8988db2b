//! A configuration as a tree of directives with every `include` expanded, for tools that
//! change a configuration and run the result (`shard-bench compare`): edit the tree, then
//! [`render`] it back to one file in nginx's syntax.
//!
//! It owns reading (the same lexer and the same `include` resolution as the parser, so a file
//! `shard -t` accepts reads the same here) and writing (quoting that reads back to the same
//! arguments). It does not validate: directives and contexts are the parser's business.
//! Comments are not kept.

use std::path::Path;

use crate::lexer::{parse_tree, Directive, Item};
use crate::parse::{include_sources, open_failed, MAX_INCLUDE_DEPTH};
use crate::ConfigError;

/// One directive: its name, arguments and, for a block, its contents; `file` and `line` say
/// where it was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub args: Vec<String>,
    pub block: Option<Vec<Node>>,
    pub file: String,
    pub line: usize,
}

impl Node {
    /// A directive made by a tool (no place in a file).
    pub fn new(name: &str, args: &[&str]) -> Node {
        Node {
            name: name.to_string(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block: None,
            file: String::new(),
            line: 0,
        }
    }
}

/// Reads the file at `path` and every file it includes, resolved as the parser resolves them
/// (relative to the directory of `path`, patterns sorted, the bundled `mime.types` when none
/// is beside the configuration), into one tree.
pub fn load_expanded(path: &Path) -> Result<Vec<Node>, ConfigError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| ConfigError::new(open_failed(path, &e)))?;
    let conf_dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.display().to_string();
    expand(&parse_tree(&text, &name), &name, conf_dir, 0)
}

fn expand(
    items: &[Item],
    file: &str,
    conf_dir: &Path,
    depth: usize,
) -> Result<Vec<Node>, ConfigError> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let d: &Directive = match item {
            Item::Dir(d) => d,
            Item::Error(e) => return Err(e.clone()),
        };
        if d.name == "include" && d.block.is_none() && d.args.len() == 1 {
            if depth >= MAX_INCLUDE_DEPTH {
                return Err(ConfigError::at(
                    file,
                    d.line,
                    format!("too deep include nesting of \"{}\"", d.args[0]),
                ));
            }
            for (path, text) in include_sources(conf_dir, d, file)? {
                let name = path.display().to_string();
                out.extend(expand(
                    &parse_tree(&text, &name),
                    &name,
                    conf_dir,
                    depth + 1,
                )?);
            }
            continue;
        }
        let block = match &d.block {
            Some(b) => Some(expand(b, file, conf_dir, depth)?),
            None => None,
        };
        out.push(Node {
            name: d.name.clone(),
            args: d.args.clone(),
            block,
            file: file.to_string(),
            line: d.line,
        });
    }
    Ok(out)
}

/// The tree as nginx configuration text, one directive per line, indented by depth.
pub fn render(nodes: &[Node]) -> String {
    let mut s = String::new();
    render_into(&mut s, nodes, 0);
    s
}

fn render_into(s: &mut String, nodes: &[Node], depth: usize) {
    for n in nodes {
        for _ in 0..depth {
            s.push_str("    ");
        }
        s.push_str(&quote(&n.name));
        for a in &n.args {
            s.push(' ');
            s.push_str(&quote(a));
        }
        match &n.block {
            Some(b) => {
                s.push_str(" {\n");
                render_into(s, b, depth + 1);
                for _ in 0..depth {
                    s.push_str("    ");
                }
                s.push_str("}\n");
            }
            None => s.push_str(";\n"),
        }
    }
}

/// A word as the lexer reads it back: bare when nothing in it is special, else in double
/// quotes with nginx's escapes.
pub fn quote(w: &str) -> String {
    let bare = !w.is_empty()
        && w.bytes().all(|b| {
            !b.is_ascii_whitespace()
                && !matches!(b, b';' | b'{' | b'}' | b'"' | b'\'' | b'#' | b'\\')
        });
    if bare {
        return w.to_string();
    }
    let mut q = String::with_capacity(w.len() + 2);
    q.push('"');
    for c in w.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            '\t' => q.push_str("\\t"),
            '\r' => q.push_str("\\r"),
            '\n' => q.push_str("\\n"),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(text: &str) -> Vec<Node> {
        expand(
            &parse_tree(text, "t.conf"),
            "t.conf",
            Path::new("/nonexistent"),
            0,
        )
        .unwrap()
    }

    #[test]
    fn render_reads_back_to_the_same_tree() {
        let text = "events { worker_connections 1024; }\n\
                    http { server { listen 127.0.0.1:8080 default_server backlog=64; \
                    return 200 \"a \\\"quoted\\\" {word};\\n\"; location ~ \\d { } \
                    add_header X-A 'single # not a comment'; set $x \"\"; } }";
        let a = tree(text);
        let b = tree(&render(&a));
        let strip = |v: &[Node]| -> Vec<(String, Vec<String>)> {
            fn walk(v: &[Node], out: &mut Vec<(String, Vec<String>)>) {
                for n in v {
                    out.push((n.name.clone(), n.args.clone()));
                    if let Some(b) = &n.block {
                        walk(b, out);
                    }
                }
            }
            let mut out = Vec::new();
            walk(v, &mut out);
            out
        };
        assert_eq!(strip(&a), strip(&b));
        let listen = &a[1].block.as_ref().unwrap()[0].block.as_ref().unwrap()[0];
        assert_eq!(
            listen.args,
            ["127.0.0.1:8080", "default_server", "backlog=64"]
        );
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote("a b"), "\"a b\"");
        assert_eq!(quote("plain"), "plain");
    }

    #[test]
    fn includes_are_expanded_in_place_in_name_order() {
        let dir = std::env::temp_dir().join(format!("shard-tree-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sites")).unwrap();
        std::fs::write(
            dir.join("main.conf"),
            "events {}\nhttp {\n include sites/*.conf;\n include mime.types;\n}\n",
        )
        .unwrap();
        std::fs::write(dir.join("sites/b.conf"), "server { listen 81; }\n").unwrap();
        std::fs::write(dir.join("sites/a.conf"), "server { listen 80; }\n").unwrap();
        let t = load_expanded(&dir.join("main.conf")).unwrap();
        let http = t[1].block.as_ref().unwrap();
        assert_eq!(http[0].block.as_ref().unwrap()[0].args, ["80"]);
        assert_eq!(http[1].block.as_ref().unwrap()[0].args, ["81"]);
        assert!(http[1].file.ends_with("sites/b.conf"));
        // No mime.types beside it: the bundled `types` block.
        assert_eq!(http[2].name, "types");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_syntax_error_in_an_included_file_names_it() {
        let dir = std::env::temp_dir().join(format!("shard-tree-err-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.conf"), "events {}\ninclude bad.conf;\n").unwrap();
        std::fs::write(dir.join("bad.conf"), "http {\n").unwrap();
        let e = load_expanded(&dir.join("main.conf")).unwrap_err();
        assert!(e.message.contains("bad.conf:"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
