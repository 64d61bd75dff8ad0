//! Writes the seed inputs of every target: `seeds DIR` creates `DIR/frame`, `DIR/handshake`
//! and `DIR/resp`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: seeds DIR");
        std::process::exit(2);
    };
    let targets = [
        ("frame", maquis_fuzz::seeds::frame()),
        ("handshake", maquis_fuzz::seeds::handshake()),
        ("resp", maquis_fuzz::seeds::resp()),
    ];
    for (target, seeds) in targets {
        let out = dir.join(target);
        std::fs::create_dir_all(&out)?;
        for (name, input) in &seeds {
            std::fs::write(out.join(name), input)?;
        }
        println!("{}: {} seeds", out.display(), seeds.len());
    }
    Ok(())
}
