//! Calls' recorded arguments, return values and injections (`record -A`, `-R`, `--inject`):
//! where the walk keeps their words, and how they read.

use crate::AnalysisError;
use fnscope_abi::data;
use fnscope_format::ImageTable;
use fnscope_symbols::argspec::{format_value, ArgSpec, Capture, Loc, RetSpec, Value};
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// What one function's calls record, from its image table's `args` line.
struct FnSpec {
    args: ArgSpec,
    ret: Option<RetSpec>,
}

/// Specs of the functions that record values, and the injection rules, per image.
#[derive(Default)]
pub(crate) struct Specs {
    funcs: HashMap<(u32, u32), Arc<FnSpec>>,
    rules: HashMap<(u32, u32), String>,
}

impl Specs {
    pub fn new<'a>(images: impl IntoIterator<Item = &'a ImageTable>) -> Specs {
        let mut s = Specs::default();
        for t in images {
            for v in &t.values {
                // A spec this fnscope cannot read (a newer agent's) shows no values.
                let Ok(args) = ArgSpec::parse(&v.args) else { continue };
                let ret = match v.ret.as_deref().map(RetSpec::parse) {
                    Some(Ok(r)) => Some(r),
                    Some(Err(_)) => continue,
                    None => None,
                };
                s.funcs.insert((t.sid, v.id), Arc::new(FnSpec { args, ret }));
            }
            for (k, text) in &t.injections {
                s.rules.insert((t.sid, *k), text.clone());
            }
        }
        s
    }
}

/// Words held in memory before older ones go to a temporary file.
const MEMORY_WORDS: usize = 4 << 20;

/// The data units of the calls a walk holds, addressed by handle (1 + the unit's offset in
/// words; 0: no unit). Beyond [`MEMORY_WORDS`] the oldest words wait in an unlinked
/// temporary file.
#[derive(Default)]
pub(crate) struct DataStore {
    mem: Vec<u64>,
    /// Offset (in words) of `mem[0]`.
    base: u64,
    file: Option<File>,
}

impl DataStore {
    /// Stores a unit; returns its handle.
    pub fn put(&mut self, words: &[u64]) -> Result<u64, AnalysisError> {
        if self.mem.len() + words.len() + 1 > MEMORY_WORDS {
            self.spill()?;
        }
        let h = self.base + self.mem.len() as u64 + 1;
        self.mem.push(words.len() as u64);
        self.mem.extend_from_slice(words);
        Ok(h)
    }

    fn spill(&mut self) -> Result<(), AnalysisError> {
        let file = match &mut self.file {
            Some(f) => f,
            None => self.file.insert(crate::spill::unlinked_temp_file()?),
        };
        let bytes: Vec<u8> = self.mem.iter().flat_map(|w| w.to_le_bytes()).collect();
        file.write_all_at(&bytes, self.base * 8).map_err(crate::spill::temp_err)?;
        self.base += self.mem.len() as u64;
        self.mem.clear();
        Ok(())
    }

    /// The unit of `handle`.
    pub fn get(&self, handle: u64) -> Result<Vec<u64>, AnalysisError> {
        let at = handle - 1;
        if at >= self.base {
            let i = (at - self.base) as usize;
            let n = self.mem[i] as usize;
            return Ok(self.mem[i + 1..i + 1 + n].to_vec());
        }
        let f = self.file.as_ref().expect("spilled words are in the file");
        let mut head = [0u8; 8];
        f.read_exact_at(&mut head, at * 8).map_err(crate::spill::temp_err)?;
        let n = u64::from_le_bytes(head) as usize;
        let mut b = vec![0u8; n * 8];
        f.read_exact_at(&mut b, at * 8 + 8).map_err(crate::spill::temp_err)?;
        Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
    }

    /// Forgets every unit (their calls were all visited).
    pub fn clear(&mut self) {
        self.base += self.mem.len() as u64;
        self.mem.clear();
    }
}

/// How an injection changed a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Injection {
    /// The function did not run: the rule's value was returned.
    Returned(String),
    /// An argument was changed before it ran.
    Argument(String),
}

impl Injection {
    /// The rule's text (`open=ret:-1,errno:2,when:nth=3`).
    pub fn rule(&self) -> &str {
        match self {
            Injection::Returned(r) | Injection::Argument(r) => r,
        }
    }
}

/// One call's recorded values, as text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallValues {
    /// The arguments recorded, in order, with their names when known.
    pub args: Vec<(Option<String>, String)>,
    /// Whether arguments were asked for (a call with none shows `()`).
    pub has_args: bool,
    /// The return value, when recorded and the function returns one.
    pub ret: Option<String>,
    /// The raw return register (rax) as a signed integer, when recorded: technique A's
    /// `ret:` shows it for every function, `void` ones included.
    pub raw_ret: Option<i64>,
    /// The injection made on this call, if any.
    pub injection: Option<Injection>,
}

impl CallValues {
    /// `(3, "abc")`: the arguments in parentheses.
    pub fn args_text(&self) -> String {
        let v: Vec<&str> = self.args.iter().map(|(_, v)| v.as_str()).collect();
        format!("({})", v.join(", "))
    }
}

/// `name` called with `args` (`(3, "abc")`): a demangled C++ name's parameter list
/// (`f(int, char const*)`) gives way to the values.
pub(crate) fn call_text(name: &str, args: &str) -> String {
    if let Some(body) = name.strip_suffix(')') {
        let mut depth = 1;
        for (i, c) in body.char_indices().rev() {
            match c {
                ')' => depth += 1,
                '(' => {
                    depth -= 1;
                    if depth == 0 {
                        return format!("{}{args}", &name[..i]);
                    }
                }
                _ => {}
            }
        }
    }
    format!("{name}{args}")
}

/// Entry words in spec order, from a unit whose entry words are the integer registers.
fn spec_order(args: &ArgSpec, regs: &[u64]) -> Vec<u64> {
    let reg = |l: Loc| match l {
        Loc::Int(n) => regs.get(n as usize).copied().unwrap_or(0),
        _ => 0,
    };
    let mut out = Vec::new();
    for it in args.items() {
        match it.capture() {
            Capture::Word(l) => out.push(reg(l)),
            Capture::Pair(a, b) => out.extend([reg(a), reg(b)]),
            _ => out.push(0),
        }
    }
    out
}

fn value_name(v: &Value, k: usize) -> Option<String> {
    v.name().map(str::to_string).or_else(|| match v {
        Value::Scalar(i) => Some(i.loc.to_string()),
        Value::Struct { .. } => Some(format!("arg{}", k + 1)),
    })
}

/// Reads a unit of function `(sid, id)`.
pub(crate) fn decode(specs: &Specs, sid: u32, id: u32, words: &[u64]) -> Option<CallValues> {
    let (&head, rest) = words.split_first()?;
    let spec = specs.funcs.get(&(sid, id));
    let n_entry = (head & data::ENTRY_WORDS_MASK) as usize;
    let n_ret = ((head >> data::RET_SHIFT) & 0xffff) as usize;
    let entry = rest.get(..n_entry)?;
    let ret = rest.get(n_entry..n_entry + n_ret)?;
    let mut out = CallValues::default();
    let rule = (head >> data::RULE_SHIFT) as u32;
    let rule_text = || specs.rules.get(&(sid, rule)).cloned().unwrap_or_else(|| format!("rule {rule}"));
    out.injection = match (head >> data::INJECT_SHIFT) & 0xff {
        data::INJECT_RETURN => Some(Injection::Returned(rule_text())),
        data::INJECT_ARGUMENT => Some(Injection::Argument(rule_text())),
        _ => None,
    };
    let Some(spec) = spec else { return Some(out) };
    out.has_args = !spec.args.values.is_empty();
    let layout = (head >> data::LAYOUT_SHIFT) & 0xff;
    let entry_words = if layout == data::LAYOUT_INT_REGS { spec_order(&spec.args, entry) } else { entry.to_vec() };
    let mut at = 0;
    for (k, v) in spec.args.values.iter().enumerate() {
        let text = format_value(v, &entry_words, &mut at).unwrap_or_else(|| "?".to_string());
        out.args.push((value_name(v, k), text));
    }
    if let Some(r) = &spec.ret {
        let items = r.items();
        if !ret.is_empty() && items.first().is_some_and(|i| i.loc == Loc::Rax) {
            out.raw_ret = Some(ret[0] as i64);
        }
        out.ret = match r {
            RetSpec::Void => None,
            RetSpec::Raw => ret.first().map(|w| (*w as i64).to_string()),
            RetSpec::Value(v) => (!ret.is_empty()).then(|| format_value(v, ret, &mut 0).unwrap_or_else(|| "?".to_string())),
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::call_text;

    #[test]
    fn values_replace_a_parameter_list() {
        assert_eq!(call_text("foo", "(3)"), "foo(3)");
        assert_eq!(call_text("ns::f(int, char const*)", "(3, \"a\")"), "ns::f(3, \"a\")");
        assert_eq!(call_text("g(void (*)(int))", "(0x10)"), "g(0x10)");
    }
}
