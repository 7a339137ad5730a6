//! Names chosen by a hostile user (issue 27): an owner label, a C function or a source file
//! name in a dump (as a traced program can choose them) are markup-free text wherever the HTML
//! page shows them, tooltips included, in real Chromium; and one frame of the flame-graph
//! input (`.folded`), never extra stacks with byte counts of their choosing. No root needed:
//! the dumps are written here the way a hostile user would hand them over.

mod common;

use std::{path::Path, process::Command};

use common::*;

/// What runs if a name becomes markup: it marks the page.
const PAYLOAD: &str = "<img src=x onerror=document.body.setAttribute('data-pwned','yes')>";

fn hostile_dump(dir: &Path) {
    let c_stack = format!(
        "0x0000000000401000 {PAYLOAD} at /src/{PAYLOAD}.c:3\n0x0000000000401100 main at /src/app.c:9\n"
    );
    let rows = [
        "1,SYSTEM,acl init,N/A,1000,7,7,N/A,N/A,,,".to_owned(),
        format!(
            "2,MALLOC,HAL,N/A,2000,7,7,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:1048576,owner:PTA@{PAYLOAD},page_type:normal}}\",,\"{c_stack}\""
        ),
        format!(
            "3,MALLOC,HAL,N/A,3000,7,7,0,0x0000000000200000,\"{{allocation_id:2,addr:0x0000000000200000,size:4096,owner:CANN,page_type:normal}}\",,\"{c_stack}\""
        ),
        "4,FREE,HAL,N/A,4000,7,7,0,0x0000000000200000,\"{allocation_id:2,addr:0x0000000000200000,size:4096,owner:CANN,page_type:normal}\",,".to_owned(),
    ];
    let text = format!("{HEADER}\n{}\n", rows.join("\n"));
    std::fs::write(dir.join("memscope_dump_20260101000000.csv"), text).unwrap();
}

/// The page with a probe script appended: it shows every chart's tooltip for each of its
/// first data items (what hovering does), then writes what it found into `#xss-check`. The
/// probe carries the page's script nonce, if the page has one, so that it may run.
fn with_probe(page: &str) -> String {
    let nonce = page
        .split("'nonce-")
        .nth(1)
        .and_then(|r| r.split('\'').next())
        .map(|n| format!(" nonce=\"{n}\""))
        .unwrap_or_default();
    let probe = format!(
        r#"<pre id="xss-check"></pre><script{nonce}>
setTimeout(function () {{
  var shown = 0;
  document.querySelectorAll('div.chart').forEach(function (div) {{
    var c = echarts.getInstanceByDom(div);
    if (!c) return;
    var n = Math.min(40, (c.getOption().series[0].data || []).length);
    for (var i = 0; i < n; i++) {{
      c.dispatchAction({{ type: 'showTip', seriesIndex: 0, dataIndex: i }});
      shown++;
    }}
  }});
  setTimeout(function () {{
    document.getElementById('xss-check').textContent = JSON.stringify({{
      shown: shown,
      imgs: document.querySelectorAll('img').length,
      pwned: document.body.getAttribute('data-pwned')
    }});
  }}, 2000);
}}, 1000);
</script>"#
    );
    // The page's own end (ECharts' source holds the string "</body>" too).
    let end = page.rfind("</body>").expect("</body>");
    format!("{}{probe}{}", &page[..end], &page[end..])
}

#[test]
fn names_from_a_dump_never_become_markup_in_the_report() {
    let Some(chromium) = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok())
    else {
        println!("SKIPPED names_from_a_dump_never_become_markup_in_the_report: needs chromium");
        return;
    };
    let dir = scratch("report_xss");
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    hostile_dump(&run);
    let page_path = dir.join("report.html");
    let out = Command::new(TRACER)
        .args(["report", "-i"])
        .arg(run.join("memscope_dump_20260101000000.csv"))
        .arg("-o")
        .arg(&page_path)
        .output()
        .unwrap();
    assert!(out.status.success(), "report: {out:?}");
    let page = std::fs::read_to_string(&page_path).unwrap();
    assert!(page.contains("onerror"), "the names are in the page");
    let probed = dir.join("probed.html");
    std::fs::write(&probed, with_probe(&page)).unwrap();

    let out = Command::new("timeout")
        .arg("300")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--window-size=1400,2600",
            "--virtual-time-budget=20000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("file://{}", probed.display()))
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium: {out:?}");
    let dom = String::from_utf8_lossy(&out.stdout);
    let start =
        dom.find("<pre id=\"xss-check\">").expect("probe element") + "<pre id=\"xss-check\">".len();
    let check = &dom[start..start + dom[start..].find("</pre>").unwrap()];
    let check: serde_json::Value =
        serde_json::from_str(&check.replace("&quot;", "\"")).expect("the probe ran");
    assert!(
        check["shown"].as_u64().unwrap() > 0,
        "no tooltip shown: {check}"
    );
    assert_eq!(
        check["pwned"],
        serde_json::Value::Null,
        "script ran: {check}"
    );
    assert_eq!(
        check["imgs"], 0,
        "markup from the dump in the page: {check}"
    );
}

/// A label ending in ` <bytes>` and a line break would make a stack of its own, with a byte
/// count of the user's choosing, in flamegraph.pl's input.
#[test]
fn an_owner_label_cannot_add_stacks_to_the_folded_file() {
    let dir = scratch("folded_label");
    let dump = dir.join("memscope_dump_20260101000000.csv");
    let stack = "0x0000000000401100 main at /src/app.c:9\n";
    let rows = [
        "1,SYSTEM,acl init,N/A,1000,7,7,N/A,N/A,,,".to_owned(),
        format!(
            "2,MALLOC,HAL,N/A,2000,7,7,0,0x0000000000001000,\"{{allocation_id:1,addr:0x0000000000001000,size:1048576,owner:PTA@fake;stack 999999999\nPTA@real,page_type:normal}}\",,\"{stack}\""
        ),
    ];
    std::fs::write(&dump, format!("{HEADER}\n{}\n", rows.join("\n"))).unwrap();
    let out = Command::new(TRACER)
        .args(["report", "--format=folded", "-i"])
        .arg(&dump)
        .arg("-o")
        .arg(dir.join("run.html"))
        .output()
        .unwrap();
    assert!(out.status.success(), "report: {out:?}");
    let folded = std::fs::read_to_string(dir.join("run.exit.folded")).unwrap();
    let lines: Vec<&str> = folded.lines().collect();
    assert_eq!(lines.len(), 1, "one live block, one stack: {folded:?}");
    let (frames, bytes) = lines[0].rsplit_once(' ').unwrap();
    assert_eq!(bytes, "1048576", "{folded:?}");
    assert_eq!(
        frames.split(';').nth(1),
        Some("PTA@fake:stack 999999999\\nPTA@real"),
        "the label is one frame: {folded:?}"
    );
}
