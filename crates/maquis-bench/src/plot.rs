//! Runs a benchmark's plotting script (Python with matplotlib, installed with pip when
//! missing) on its output directory.

use std::path::Path;
use std::process::Command;

/// Writes `script` (the text of `name`) into `out`, runs it as `python3 out/name out args…`,
/// removes it, and returns the lines it printed (the PNG files it wrote).
pub fn run(out: &Path, name: &str, script: &str, args: &[&str]) -> Result<Vec<String>, String> {
    let has = || {
        Command::new("python3")
            .args(["-c", "import matplotlib"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has() {
        eprintln!("matplotlib is not installed: installing it with pip ...");
        let ok = Command::new("python3")
            .args(["-m", "pip", "install", "-q", "matplotlib"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok || !has() {
            return Err("python3 with matplotlib is needed for the plots".into());
        }
    }
    let path = out.join(name);
    std::fs::write(&path, script).map_err(|e| e.to_string())?;
    let o = Command::new("python3")
        .arg(&path)
        .arg(out)
        .args(args)
        .output()
        .map_err(|e| e.to_string());
    let _ = std::fs::remove_file(&path);
    let o = o?;
    if !o.status.success() {
        return Err(String::from_utf8_lossy(&o.stderr).to_string());
    }
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// Runs `script` as [`run`] does and returns a report's "Plots" section linking the images it
/// wrote (empty when it wrote none, or could not run: then it says why on stderr).
pub fn section(out: &Path, name: &str, script: &str, args: &[&str]) -> String {
    match run(out, name, script, args) {
        Ok(pngs) if !pngs.is_empty() => {
            let links: Vec<String> = pngs.iter().map(|p| format!("![{p}]({p})")).collect();
            format!("\n## Plots\n\n{}\n", links.join("\n"))
        }
        Ok(_) => String::new(),
        Err(e) => {
            eprintln!("plots skipped: {e}");
            String::new()
        }
    }
}
