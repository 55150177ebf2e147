//! Experiment: two prefetch distances of the tiled kernels, alternated step by step.
use std::time::Instant;

use model::{Kernels, Logits, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let steps: usize = args[2].parse()?;
    let d: [usize; 2] = [args[3].parse()?, args[4].parse()?];
    model::pool::init(2);
    let mut m = Model::open(&args[1])?;
    m.set_kernels(Kernels::Int8);
    let mut st = m.new_state();
    m.forward(&mut st, &[1], Logits::Last)?;
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..2 * steps {
        let k = [0, 1, 1, 0][i % 4];
        quant::set_prefetch_distance(d[k]);
        let t = Instant::now();
        m.forward(&mut st, &[(i % 1000) as u32 + 2], Logits::Last)?;
        times[k].push(t.elapsed().as_secs_f64());
    }
    for k in 0..2 {
        let mut v = times[k].clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "distance {}: median {:.1} ms, mean {:.1} ms ({} steps)",
            d[k],
            1e3 * v[v.len() / 2],
            1e3 * mean,
            v.len()
        );
    }
    Ok(())
}
