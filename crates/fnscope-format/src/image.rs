//! Parsing and printing of the agent's image tables (`DIR/images/<sid>.txt`, also stored in
//! IMAGE chunks, compressed from format version 5 on). The text format is specified in `fnscope_abi::image`.

use crate::FormatError;
use fnscope_abi::image::{MAGIC, VERSION};
use std::fmt::Write as _;

/// What one process image hooked and skipped: the parsed form of an image table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageTable {
    /// Image session id (records' segments name it in `image_sid`).
    pub sid: u32,
    /// Process id of the image.
    pub pid: u32,
    /// Path of the executable.
    pub exe: String,
    /// Command line, `argv[0]` included.
    pub args: Vec<String>,
    /// Loaded modules that were inspected.
    pub modules: Vec<ModuleEntry>,
    /// Hooked functions, indexed by id: `funcs[id].id == id`.
    pub funcs: Vec<FuncEntry>,
    /// Functions that were not hooked, with the reason.
    pub skipped: Vec<SkipEntry>,
    /// Functions listed in `funcs` whose jump could not be written after all (the table is
    /// written before patching), by id, with the reason.
    pub unhooked: Vec<(u32, String)>,
    /// Modules `record --app-only` treated as system code and did not hook.
    pub system: Vec<String>,
    /// Functions whose calls carry a data unit (`record -A`/`-R`/`--inject`).
    pub values: Vec<ValuesEntry>,
    /// Injection rules (`record --inject`), by index, as text.
    pub injections: Vec<(u32, String)>,
}

/// What the calls of one function record: the `args` line of an image table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValuesEntry {
    /// Function id.
    pub id: u32,
    /// Argument spec (`fnscope_symbols::argspec::ArgSpec`'s text; empty: none).
    pub args: String,
    /// Return spec (`RetSpec`'s text), or `None` when the return value is not recorded.
    pub ret: Option<String>,
    /// Indices of the injection rules that apply to it.
    pub rules: Vec<u32>,
}

/// One ELF module of an image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleEntry {
    /// Index that `func`/`skip` lines refer to.
    pub index: u32,
    /// Load bias: run-time address minus link-time address.
    pub bias: u64,
    /// GNU build-id in hex, when the module has one.
    pub build_id: Option<String>,
    /// Path of the module file.
    pub path: String,
}

/// One hooked function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FuncEntry {
    /// Id carried by records.
    pub id: u32,
    /// Index of the module ([`ModuleEntry::index`]).
    pub module: u32,
    /// Link-time address in the module's ELF file.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Symbol name as found in the ELF file (mangled).
    pub raw_name: String,
}

/// One function that was not hooked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkipEntry {
    /// Index of the module ([`ModuleEntry::index`]).
    pub module: u32,
    /// Link-time address in the module's ELF file.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// One of the `fnscope_abi::skip_reason` codes.
    pub reason: String,
    /// Free text explaining the reason (which instruction, which branch, ...).
    pub detail: String,
    /// Symbol name as found in the ELF file (mangled).
    pub raw_name: String,
}

impl ImageTable {
    /// Parses an image table. `sid` is the image session id (the file name or the IMAGE
    /// chunk carries it, the text does not).
    ///
    /// Lines with an unknown keyword are ignored so that newer agents can add items; a table
    /// of a newer version, a malformed known line, or function ids that are not exactly
    /// `0..n` are errors.
    pub fn parse(sid: u32, text: &str) -> Result<ImageTable, FormatError> {
        let bad = |line: usize, msg: String| FormatError::BadImageTable { sid, line, msg };
        let mut t = ImageTable {
            sid,
            ..ImageTable::default()
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, first)) => {
                let (kw, ver) = first.split_once('\t').unwrap_or((first, ""));
                if kw != MAGIC {
                    return Err(bad(1, format!("first line must start with `{MAGIC}`")));
                }
                let ver: u32 = ver
                    .trim()
                    .parse()
                    .map_err(|_| bad(1, format!("bad version `{ver}`")))?;
                if ver > VERSION {
                    return Err(bad(
                        1,
                        format!(
                            "image table version {ver} is newer than this fnscope (supports \
                             {VERSION}): upgrade fnscope"
                        ),
                    ));
                }
            }
            None => return Err(bad(1, "empty image table".into())),
        }
        for (i, line) in lines {
            let n = i + 1;
            if line.is_empty() {
                continue;
            }
            let (kw, rest) = line.split_once('\t').unwrap_or((line, ""));
            match kw {
                "pid" => t.pid = dec(rest).ok_or_else(|| bad(n, format!("bad pid `{rest}`")))?,
                "exe" => t.exe = rest.to_string(),
                "arg" => t.args.push(rest.to_string()),
                "module" => {
                    let f: Vec<&str> = rest.splitn(4, '\t').collect();
                    if f.len() != 4 {
                        return Err(bad(n, "module line needs 4 fields".into()));
                    }
                    t.modules.push(ModuleEntry {
                        index: dec(f[0]).ok_or_else(|| bad(n, "bad module index".into()))?,
                        bias: hex(f[1]).ok_or_else(|| bad(n, "bad load bias".into()))?,
                        build_id: (f[2] != "-" && !f[2].is_empty()).then(|| f[2].to_string()),
                        path: f[3].to_string(),
                    });
                }
                "func" => {
                    let f: Vec<&str> = rest.splitn(5, '\t').collect();
                    if f.len() != 5 {
                        return Err(bad(n, "func line needs 5 fields".into()));
                    }
                    t.funcs.push(FuncEntry {
                        id: dec(f[0]).ok_or_else(|| bad(n, "bad function id".into()))?,
                        module: dec(f[1]).ok_or_else(|| bad(n, "bad module index".into()))?,
                        address: hex(f[2]).ok_or_else(|| bad(n, "bad address".into()))?,
                        size: dec(f[3]).ok_or_else(|| bad(n, "bad size".into()))?,
                        raw_name: f[4].to_string(),
                    });
                }
                "skip" => {
                    let f: Vec<&str> = rest.splitn(6, '\t').collect();
                    if f.len() != 6 {
                        return Err(bad(n, "skip line needs 6 fields".into()));
                    }
                    t.skipped.push(SkipEntry {
                        module: dec(f[0]).ok_or_else(|| bad(n, "bad module index".into()))?,
                        address: hex(f[1]).ok_or_else(|| bad(n, "bad address".into()))?,
                        size: dec(f[2]).ok_or_else(|| bad(n, "bad size".into()))?,
                        reason: f[3].to_string(),
                        detail: f[4].to_string(),
                        raw_name: f[5].to_string(),
                    });
                }
                "system" => t.system.push(rest.to_string()),
                "args" => {
                    let f: Vec<&str> = rest.splitn(4, '\t').collect();
                    if f.len() != 4 {
                        return Err(bad(n, "args line needs 4 fields".into()));
                    }
                    let rules = if f[3] == "-" { Vec::new() } else { f[3].split(',').map(dec).collect::<Option<Vec<u32>>>().ok_or_else(|| bad(n, "bad rule list".into()))? };
                    t.values.push(ValuesEntry {
                        id: dec(f[0]).ok_or_else(|| bad(n, "bad function id".into()))?,
                        args: f[1].to_string(),
                        ret: (f[2] != "-").then(|| f[2].to_string()),
                        rules,
                    });
                }
                "inject" => {
                    let (k, text) = rest.split_once('\t').unwrap_or((rest, ""));
                    t.injections.push((dec(k).ok_or_else(|| bad(n, "bad rule index".into()))?, text.to_string()));
                }
                "unhooked" => {
                    let (id, why) = rest.split_once('\t').unwrap_or((rest, ""));
                    let id = dec(id).ok_or_else(|| bad(n, format!("bad function id `{id}`")))?;
                    t.unhooked.push((id, why.to_string()));
                }
                _ => {}
            }
        }
        t.funcs.sort_by_key(|f| f.id);
        if let Some((i, f)) = t
            .funcs
            .iter()
            .enumerate()
            .find(|(i, f)| f.id as usize != *i)
        {
            return Err(bad(
                0,
                format!(
                    "function ids must be 0..{} without gaps; found id {} at position {i}",
                    t.funcs.len(),
                    f.id
                ),
            ));
        }
        Ok(t)
    }

    /// Prints the table in the agent's text format; [`ImageTable::parse`] reads it back
    /// unchanged.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        // Writing to a String cannot fail.
        let _ = writeln!(s, "{MAGIC}\t{VERSION}");
        let _ = writeln!(s, "pid\t{}", self.pid);
        let _ = writeln!(s, "exe\t{}", self.exe);
        for a in &self.args {
            let _ = writeln!(s, "arg\t{a}");
        }
        for m in &self.modules {
            let bid = m.build_id.as_deref().unwrap_or("-");
            let _ = writeln!(s, "module\t{}\t{:x}\t{bid}\t{}", m.index, m.bias, m.path);
        }
        for f in &self.funcs {
            let _ = writeln!(
                s,
                "func\t{}\t{}\t{:x}\t{}\t{}",
                f.id, f.module, f.address, f.size, f.raw_name
            );
        }
        for k in &self.skipped {
            let _ = writeln!(
                s,
                "skip\t{}\t{:x}\t{}\t{}\t{}\t{}",
                k.module, k.address, k.size, k.reason, k.detail, k.raw_name
            );
        }
        for (k, text) in &self.injections {
            let _ = writeln!(s, "inject\t{k}\t{text}");
        }
        for v in &self.values {
            let rules = if v.rules.is_empty() { "-".to_string() } else { v.rules.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(",") };
            let _ = writeln!(s, "args\t{}\t{}\t{}\t{rules}", v.id, v.args, v.ret.as_deref().unwrap_or("-"));
        }
        s
    }

    /// The module with index `index`, if listed.
    pub fn module(&self, index: u32) -> Option<&ModuleEntry> {
        self.modules
            .get(index as usize)
            .filter(|m| m.index == index)
            .or_else(|| self.modules.iter().find(|m| m.index == index))
    }
}

/// Where the body of an image table starts: its first `func` or `skip` line, or its end.
/// The lines before (process, arguments, the first module with its load bias) differ from
/// process to process; the first module's functions after them are the same for every
/// process of a program (the analysis they come from depends on the binary alone), so a
/// writer can store them once.
///
/// Line by line, stopping at the first body line: a search for each keyword would go through
/// a big program's whole table (megabytes) for a kind of line it lacks.
pub(crate) fn body_start(text: &str) -> usize {
    let mut at = 0;
    while let Some(nl) = text[at..].find('\n') {
        at += nl + 1;
        if text[at..].starts_with("func\t") || text[at..].starts_with("skip\t") {
            return at;
        }
    }
    text.len()
}

fn dec<T: std::str::FromStr>(s: &str) -> Option<T> {
    s.trim().parse().ok()
}

/// Hex with or without a `0x` prefix: the ABI says "hex" without fixing the spelling.
fn hex(s: &str) -> Option<u64> {
    let s = s.trim();
    let s = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "fnscope-image\t1\npid\t42\nexe\t/bin/prog\narg\t/bin/prog\narg\t-x y\n\
module\t0\t0x5555\tabcdef\t/bin/prog\nmodule\t1\t7f00\t-\t/lib/libc.so.6\n\
func\t1\t0\t1130\t20\t_ZN3foo3barEv\nfunc\t0\t0\t0x1100\t10\tmain\n\
skip\t1\t2000\t3\ttoo-short\t3 bytes\tshort\tname\nfuture\tstuff\n";

    #[test]
    fn the_body_starts_at_the_first_function_or_skip_line() {
        let head = "fnscope-image\t1\npid\t42\nmodule\t0\t0\t-\t/bin/prog\n";
        for body in ["func\t0\t0\t10\t1\tf\nskip\t0\t20\t1\tx\ty\n", "skip\t0\t20\t1\tx\ty\nfunc\t0\t0\t10\t1\tf\n"] {
            let text = format!("{head}{body}");
            assert_eq!(body_start(&text), head.len());
        }
        assert_eq!(body_start(head), head.len());
        assert_eq!(body_start("func\t0\t0\t10\t1\tf\n"), "func\t0\t0\t10\t1\tf\n".len(), "the first line is the header's");
    }

    #[test]
    fn parses_and_round_trips() {
        let t = ImageTable::parse(7, SAMPLE).unwrap();
        assert_eq!(t.sid, 7);
        assert_eq!(t.pid, 42);
        assert_eq!(t.args, vec!["/bin/prog", "-x y"]);
        assert_eq!(t.modules[0].bias, 0x5555);
        assert_eq!(t.modules[1].build_id, None);
        assert_eq!(t.funcs[0].raw_name, "main");
        assert_eq!(t.funcs[1].address, 0x1130);
        assert_eq!(t.skipped[0].raw_name, "short\tname");
        assert_eq!(t.module(1).unwrap().path, "/lib/libc.so.6");
        let again = ImageTable::parse(7, &t.to_text()).unwrap();
        assert_eq!(t, again);
    }

    #[test]
    fn rejects_bad_tables() {
        assert!(ImageTable::parse(0, "").is_err());
        assert!(ImageTable::parse(0, "hello\n").is_err());
        let e = ImageTable::parse(0, "fnscope-image\t2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("upgrade fnscope"), "{e}");
        assert!(ImageTable::parse(0, "fnscope-image\t1\nfunc\t1\t0\t0\t0\tx\n").is_err());
        assert!(ImageTable::parse(0, "fnscope-image\t1\nfunc\tz\n").is_err());
    }
}
