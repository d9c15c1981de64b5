//! Collapsed stacks (`main;work;leaf 1234`), the input of flame-graph tools: one line per
//! distinct stack, weighed by the self time of its last function or by its calls.

use crate::stacks::{
    frame_name, narrowed, program_name, read_meta, untimed, walk_stacks, Ended, Sink,
};
use crate::{ExportError, Options, Output, Progress, Weight};
use fnscope_analysis::{CallInfo, WalkContext};
use fnscope_format::Meta;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The root of the trie: no function.
const ROOT: u32 = 0;

/// One distinct stack: its last function under the stack of `parent`.
struct Node {
    parent: u32,
    func: u32,
    calls: u64,
    self_ticks: u64,
    /// What the stack weighs, once the walk is over.
    weight: u64,
}

/// Every distinct stack seen, keyed by (parent stack, function): memory grows with the
/// distinct stacks, not with the calls.
struct Trie {
    nodes: Vec<Node>,
    index: HashMap<(u32, u32), u32>,
    /// Frame names by function index, filled as functions are met.
    names: Vec<Option<String>>,
}

impl Trie {
    fn new() -> Trie {
        Trie {
            nodes: vec![Node {
                parent: ROOT,
                func: u32::MAX,
                calls: 0,
                self_ticks: 0,
                weight: 0,
            }],
            index: HashMap::new(),
            names: Vec::new(),
        }
    }

    fn child(&mut self, parent: u32, func: u32) -> u32 {
        let nodes = &mut self.nodes;
        *self.index.entry((parent, func)).or_insert_with(|| {
            nodes.push(Node {
                parent,
                func,
                calls: 0,
                self_ticks: 0,
                weight: 0,
            });
            (nodes.len() - 1) as u32
        })
    }

    fn name(&self, func: u32) -> &str {
        self.names
            .get(func as usize)
            .and_then(|n| n.as_deref())
            .unwrap_or("?")
    }

    /// Calls `line(stack, node)` for every stack, depth first, siblings by name.
    fn each(&self, mut line: impl FnMut(&str, &Node)) {
        let mut children: Vec<Vec<u32>> = vec![Vec::new(); self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().skip(1) {
            children[n.parent as usize].push(i as u32);
        }
        for c in &mut children {
            c.sort_by(|&a, &b| {
                self.name(self.nodes[a as usize].func)
                    .cmp(self.name(self.nodes[b as usize].func))
            });
        }
        let mut path = String::new();
        // (node, length of the path before its name); pushed in reverse to come out in order.
        let mut todo: Vec<(u32, usize)> = children[ROOT as usize]
            .iter()
            .rev()
            .map(|&c| (c, 0))
            .collect();
        while let Some((i, len)) = todo.pop() {
            path.truncate(len);
            if len > 0 {
                path.push(';');
            }
            let node = &self.nodes[i as usize];
            path.push_str(self.name(node.func));
            line(&path, node);
            let here = path.len();
            todo.extend(children[i as usize].iter().rev().map(|&c| (c, here)));
        }
    }
}

/// Folded stacks of a trace, ready to write or draw.
pub(crate) struct Folded {
    trie: Trie,
    /// The program's name, for titles.
    pub program: String,
    /// The trace's warnings and those of the export.
    pub warnings: Vec<String>,
}

impl Folded {
    /// Calls `line(stack, weight)` for every stack, depth first, siblings by name. Each stack
    /// is made in one buffer as it comes: writing them all costs no more memory than the trie.
    pub(crate) fn each(&self, mut line: impl FnMut(&str, u64)) {
        self.trie.each(|stack, node| line(stack, node.weight));
    }
}

/// Folds the calls of the trace at `input` selected by `opts` into stacks weighed by `weight`.
/// Count-mode and merged traces, which have no stacks, give one single-frame stack per
/// function when weighed by calls, and are refused when weighed by time.
pub(crate) fn fold(
    input: &Path,
    opts: &Options,
    weight: Weight,
    progress: Progress<'_>,
) -> Result<Folded, ExportError> {
    if weight == Weight::SelfTime {
        crate::require_times(input, "weighing stacks by time")?;
    }
    let meta = read_meta(input)?;
    if let Some(mode) = untimed(&meta) {
        return flat(input, opts, &meta, mode);
    }
    let mut trie = Trie::new();
    let enter = |trie: &mut Trie, cx: &mut WalkContext, caller: Option<u32>, c: &CallInfo| {
        let func = c.func as usize;
        if trie.names.len() <= func {
            trie.names.resize(func + 1, None);
        }
        if trie.names[func].is_none() {
            trie.names[func] = Some(frame_name(cx.names.name(c.func)));
        }
        trie.child(caller.unwrap_or(ROOT), c.func)
    };
    let exit = |trie: &mut Trie, e: Ended<u32>| {
        let n = &mut trie.nodes[e.key as usize];
        n.calls += 1;
        n.self_ticks = n.self_ticks.saturating_add(e.self_ticks);
    };
    let trace = walk_stacks(input, opts, progress, &mut trie, enter, exit)?;
    for n in &mut trie.nodes {
        n.weight = match weight {
            Weight::SelfTime => trace.ticks_to_ns(n.self_ticks),
            Weight::Calls => n.calls,
        };
    }
    Ok(Folded {
        trie,
        program: program_name(&meta),
        warnings: trace.warnings,
    })
}

/// The single-frame stacks of a trace that counted calls per function only.
fn flat(input: &Path, opts: &Options, meta: &Meta, mode: &str) -> Result<Folded, ExportError> {
    if narrowed(opts) {
        return Err(ExportError::BadOption(format!(
            "{} is a {mode} trace: it holds calls per function only, so --pid, --tid, --time, \
             --filter, --exclude and --min-duration cannot apply; leave them out",
            input.display()
        )));
    }
    let report = fnscope_analysis::report(input, false)?;
    let mut by_name: BTreeMap<String, u64> = BTreeMap::new();
    for f in &report.functions {
        *by_name.entry(frame_name(&f.name)).or_default() += f.calls;
    }
    // Each name is a function of its own at the root.
    let mut trie = Trie::new();
    for (i, (name, calls)) in by_name.into_iter().enumerate() {
        let n = trie.child(ROOT, i as u32);
        trie.nodes[n as usize].weight = calls;
        trie.names.push(Some(name));
    }
    let mut warnings = report.warnings;
    warnings.push(format!(
        "{} is a {mode} trace: no stacks were recorded, so each function is a stack of its own \
         with all its calls; record with the default --mode time for stacks",
        input.display()
    ));
    Ok(Folded {
        trie,
        program: program_name(meta),
        warnings,
    })
}

pub(crate) fn write(
    input: &Path,
    opts: &Options,
    weight: Weight,
    out: &Output,
    progress: Progress<'_>,
) -> Result<Vec<String>, ExportError> {
    let folded = fold(input, opts, weight, progress)?;
    let mut sink = Sink::whole(out, "a folded-stacks file")?;
    let mut r = Ok(());
    folded.each(|stack, w| {
        if r.is_ok() {
            r = writeln!(sink.w(), "{stack} {w}");
        }
    });
    sink.check(r)?;
    sink.finish()?;
    Ok(folded.warnings)
}
