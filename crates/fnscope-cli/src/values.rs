//! `record -A`, `-R`, `--args auto` and `--inject`: which functions record their arguments and
//! return values, and which calls are changed (see the agent's `args.rs`).

use anyhow::{anyhow, bail, Result};
use fnscope_symbols::argspec::{ArgSpec, InjectRule, RetSpec};

/// Arguments, return values and injections.
#[derive(clap::Args)]
pub struct ValueArgs {
    /// Record the arguments of functions matching PATTERN (a glob on the name), as SPEC says
    /// (e.g. `open@arg1/s,arg2/x`; see docs/ARGS.md), or from the debug information when
    /// no @SPEC is given. Repeatable.
    #[arg(short = 'A', long = "argument", value_name = "PATTERN[@SPEC]")]
    arguments: Vec<String>,
    /// Record the return value of functions matching PATTERN, typed as TYPE (e.g.
    /// `malloc@p`, `sqrt@f64`), from the debug information, or as the raw rax. Repeatable.
    #[arg(short = 'R', long = "retval", value_name = "PATTERN[@TYPE]")]
    retvals: Vec<String>,
    /// `auto`: record every hooked function's arguments and return value whose types the
    /// debug information gives.
    #[arg(long = "args", value_name = "auto", value_parser = ["auto"])]
    args: Option<String>,
    /// Change calls: `FUNC=ret:VALUE[,errno:E][,when:COND][,seed:S]` returns VALUE without
    /// running FUNC; `FUNC@argN=VALUE[,when:COND]` changes an argument. COND: nth=N, first=N,
    /// after=N, prob=P, argN=V (all must hold). Every change is recorded. Repeatable.
    #[arg(long = "inject", value_name = "RULE")]
    injects: Vec<String>,
}

fn split(s: &str) -> (&str, Option<&str>) {
    match s.split_once('@') {
        Some((p, spec)) => (p, Some(spec)),
        None => (s, None),
    }
}

fn check_glob(option: &str, p: &str) -> Result<()> {
    if p.is_empty() || p.contains(['\t', '\n']) {
        bail!("{option} {p:?}: give a function name or a glob such as 'read*'");
    }
    glob::Pattern::new(p).map_err(|e| anyhow!("{option} {p:?}: {e}"))?;
    Ok(())
}

impl ValueArgs {
    /// Checks every option and returns the agent's setting text (empty: nothing asked).
    pub fn check(self, count: bool) -> Result<String> {
        let asked = !self.arguments.is_empty() || !self.retvals.is_empty() || self.args.is_some() || !self.injects.is_empty();
        if count && asked {
            bail!("-A, -R, --args and --inject work on calls as they run: they need timing mode, not --mode count");
        }
        let mut out = String::new();
        for a in &self.arguments {
            let (p, spec) = split(a);
            check_glob("-A", p)?;
            if let Some(s) = spec {
                ArgSpec::parse(s).map_err(|e| anyhow!("-A {a:?}: {e}"))?;
            }
            out.push_str(&format!("A\t{p}\t{}\n", spec.unwrap_or("")));
        }
        for r in &self.retvals {
            let (p, spec) = split(r);
            check_glob("-R", p)?;
            if let Some(s) = spec {
                RetSpec::parse(s).map_err(|e| anyhow!("-R {r:?}: {e}"))?;
            }
            out.push_str(&format!("R\t{p}\t{}\n", spec.unwrap_or("")));
        }
        for i in &self.injects {
            if i.contains(['\t', '\n']) {
                bail!("--inject {i:?}: no tabs or newlines");
            }
            let rule = InjectRule::parse(i).map_err(|e| anyhow!("--inject {e}"))?;
            check_glob("--inject", &rule.pattern)?;
            out.push_str(&format!("I\t{i}\n"));
        }
        if self.args.is_some() {
            out.push_str("AUTO\n");
        }
        Ok(out)
    }
}
