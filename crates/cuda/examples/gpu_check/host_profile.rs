//! `bench --host-profile`: the host side of the timed decode runs sampled (pprof-rs, 997
//! Hz; built with `--features host-profile`), printed as the functions most often on top
//! of the stack (self) and anywhere in it (inclusive). What the host does between graph
//! replays — recording a step's ops, finding its graph, reading the logits — without a
//! system profiler on the GPU machine.

use std::collections::HashMap;

use crate::Res;

#[cfg(feature = "host-profile")]
pub struct HostProfile(pprof::ProfilerGuard<'static>);

#[cfg(not(feature = "host-profile"))]
pub struct HostProfile;

impl HostProfile {
    #[cfg(feature = "host-profile")]
    pub fn start() -> Res<Self> {
        Ok(HostProfile(pprof::ProfilerGuard::new(997)?))
    }

    #[cfg(not(feature = "host-profile"))]
    pub fn start() -> Res<Self> {
        Err("--host-profile needs gpu_check built with `--features host-profile`".into())
    }

    /// Prints the `top` functions by self and by inclusive samples.
    #[cfg(feature = "host-profile")]
    pub fn print(self, top: usize) -> Res<()> {
        let report = self.0.report().build()?;
        let mut own: HashMap<String, isize> = HashMap::new();
        let mut incl: HashMap<String, isize> = HashMap::new();
        let mut total = 0;
        for (frames, &n) in &report.data {
            total += n;
            let names: Vec<String> = frames
                .frames
                .iter()
                .flat_map(|f| f.iter().map(|s| s.name()))
                .collect();
            let leaf = names.first().cloned().unwrap_or_else(|| "?".into());
            *own.entry(leaf).or_default() += n;
            let mut seen: Vec<&String> = Vec::new();
            for name in &names {
                if !seen.contains(&name) {
                    seen.push(name);
                    *incl.entry(name.clone()).or_default() += n;
                }
            }
        }
        print_top("self", &own, total, top);
        print_top("inclusive", &incl, total, top);
        Ok(())
    }

    #[cfg(not(feature = "host-profile"))]
    pub fn print(self, _top: usize) -> Res<()> {
        Ok(())
    }
}

#[cfg_attr(not(feature = "host-profile"), allow(dead_code))]
fn print_top(kind: &str, counts: &HashMap<String, isize>, total: isize, top: usize) {
    let mut v: Vec<(&String, &isize)> = counts.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    println!("host profile, {kind} ({total} samples):");
    for (name, &n) in v.into_iter().take(top) {
        let short: String = name.chars().take(150).collect();
        println!("  {:5.1}%  {short}", 100.0 * n as f64 / total.max(1) as f64);
    }
}
