//! `cargo xtask test-aarch64 --insn-cost`: the cost of a uprobe on each kind of first
//! instruction under the VM's kernel (the arm64 half of the bench's insn table,
//! docs/placement.md).

use super::{MARK, TAG, VmRun};

/// Times each function untraced and with a uprobe on its first instruction (no BPF: the
/// trap's own cost), 3 rounds.
pub const INSN_COST: &str = r#"T=/sys/kernel/tracing
echo 0 > $T/tracing_on
for name in $($INSN --list); do
    addr=$(nm $INSN | awk -v n=$name '$3 == n { print $1 }')
    for round in 1 2 3; do
        base=$($INSN $name 5000)
        echo "p:msbench/e_$name $INSN:0x$addr" >> $T/uprobe_events
        echo 1 > $T/events/msbench/e_$name/enable
        probed=$($INSN $name 5000)
        echo 0 > $T/events/msbench/e_$name/enable
        echo "-:msbench/e_$name" >> $T/uprobe_events
        echo "@@memscope-vm insn $name $base $probed"
    done
done
"#;

/// The insn lines as a table: median cost per call, and the class by its ratio to a plain
/// branch (`b`, which the arm64 kernel always simulates).
pub fn insn_table(run: &VmRun) {
    let mut costs: std::collections::BTreeMap<&str, Vec<(f64, f64)>> = Default::default();
    let mut order = Vec::new();
    for l in &run.lines {
        let Some(rest) = l.strip_prefix(&format!("{MARK} insn ")) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if let [name, base, probed] = f[..]
            && let (Ok(b), Ok(p)) = (base.parse::<f64>(), probed.parse::<f64>())
        {
            if !costs.contains_key(name) {
                order.push(name);
            }
            costs.entry(name).or_default().push((b, p));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let stats = |name: &str| {
        let v = &costs[name];
        let base = median(&mut v.iter().map(|x| x.0).collect());
        let probed = median(&mut v.iter().map(|x| x.1).collect());
        let cost = median(&mut v.iter().map(|x| x.1 - x.0).collect());
        (base, probed, cost)
    };
    let branch = costs.contains_key("ins_b").then(|| stats("ins_b").2);
    println!("{TAG} uprobe cost by first instruction (ns per call under TCG, median of 3):");
    println!("| function | untraced | uprobe | cost | cost / cost(b) | class |");
    println!("|---|---:|---:|---:|---:|---|");
    for name in order {
        let (base, probed, cost) = stats(name);
        let ratio = branch.map_or(f64::NAN, |b| cost / b);
        let class = if ratio < 0.2 {
            "refused"
        } else if ratio < 1.5 {
            "simulated"
        } else {
            "single-stepped"
        };
        println!("| {name} | {base:.0} | {probed:.0} | {cost:.0} | {ratio:.2} | {class} |");
    }
}
