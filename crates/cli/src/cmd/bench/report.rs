//! What `niwaki bench` prints: a markdown table and notes for people, or one JSON object.

use std::path::Path;

use super::DepthFill;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub fn stats(mut v: Vec<f64>) -> Stats {
    if v.is_empty() {
        return Stats::default();
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    };
    Stats {
        median,
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// Where the runs ran, and what memory they held there.
pub enum Place {
    Cpu {
        threads: usize,
        /// Peak resident set of the decode runs.
        peak_rss: u64,
        /// The widest instruction set the kernels ran at (`NIWAKI_SIMD` caps it).
        simd: &'static str,
    },
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Cuda {
        device: String,
        /// Device bytes of the weights.
        weight_bytes: u64,
    },
}

/// One bench's measurements.
pub struct Report<'a> {
    pub model: &'a Path,
    pub file_bytes: u64,
    pub place: Place,
    /// The KV cache's format.
    pub kv_cache: &'static str,
    /// A sequence's state: on the CPU its recurrent state and KV cache at the end of a decode
    /// run (0 with none), on the GPU its state, KV cache and scratch.
    pub state_bytes: u64,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    /// How the depth was filled (`prompt` or `zeros`).
    pub depth_fill: DepthFill,
    pub reps: usize,
    /// Decode copied each step's logits to the host and picked there (else the backend picked).
    pub host_logits: bool,
    /// tok/s of each repetition.
    pub pp: Vec<f64>,
    pub tg: Vec<f64>,
    /// The tokens the decode runs picked (`None` without a decode run).
    pub picks: Option<super::picks::Picks>,
    /// Decode tokens run untimed before the first run, on the state every run rewound to
    /// (0: each run on a fresh state, its one-time setup timed).
    pub tg_warmup: usize,
    /// Read bandwidth (GB/s) measured after each decode run (or once, with none).
    pub bw_after: Vec<f64>,
    /// Bytes a decode step moves at the runs' average context.
    pub bytes_per_token: u64,
}

impl Report<'_> {
    /// The bandwidth decode run `i` is held against: the mean of the tests before and after
    /// it (the first run has only the one after). On a shared machine the bandwidth moves
    /// from minute to minute, so each run is held against the tests on either side of it
    /// rather than against one test at the end.
    fn around(&self, i: usize) -> f64 {
        let before = i.checked_sub(1).and_then(|j| self.bw_after.get(j));
        match (before, self.bw_after.get(i)) {
            (Some(b), Some(a)) => (a + b) / 2.0,
            (_, Some(a)) => *a,
            (Some(b), None) => *b,
            (None, None) => 0.0,
        }
    }

    /// Each decode run's fraction of the floor set by the bandwidth measured around it.
    pub fn fractions(&self) -> Vec<f64> {
        self.tg
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let bw = self.around(i);
                if bw > 0.0 {
                    s * self.bytes_per_token as f64 / (bw * 1e9)
                } else {
                    0.0
                }
            })
            .collect()
    }

    pub fn bandwidth(&self) -> Stats {
        stats(self.bw_after.clone())
    }

    /// tok/s the bandwidth allows: a step's bytes read once at the median bandwidth.
    pub fn floor(&self) -> f64 {
        self.bandwidth().median * 1e9 / self.bytes_per_token.max(1) as f64
    }

    pub fn fraction(&self) -> f64 {
        stats(self.fractions()).median
    }

    pub fn json(&self) -> serde_json::Value {
        let (pp, tg) = (stats(self.pp.clone()), stats(self.tg.clone()));
        let mut o = serde_json::json!({
            "model": self.model.display().to_string(),
            "n_prompt": self.n_prompt, "n_gen": self.n_gen, "n_depth": self.depth,
            "depth_fill": self.depth_fill.as_str(),
            "repetitions": self.reps,
            "tg_pick": if self.host_logits { "host_logits" } else { "backend" },
            "tg_warmup_tokens": self.tg_warmup,
            "pp_tok_s": pp.median, "pp_min": pp.min, "pp_max": pp.max,
            "tg_tok_s": tg.median, "tg_min": tg.min, "tg_max": tg.max,
            "file_bytes": self.file_bytes,
            "read_bw_gbs": self.bandwidth().median, "read_bw_tests_gbs": self.bw_after,
            "bytes_per_token": self.bytes_per_token,
            "floor_tok_s": self.floor(), "floor_fraction": self.fraction(),
            "floor_fraction_runs": self.fractions(),
        });
        let extra = match &self.place {
            Place::Cpu {
                threads,
                peak_rss,
                simd,
            } => serde_json::json!({
                "device": "cpu", "threads": threads, "simd": simd, "kv_cache": self.kv_cache,
                "peak_rss_bytes": peak_rss, "state_bytes": self.state_bytes,
            }),
            Place::Cuda {
                device,
                weight_bytes,
            } => serde_json::json!({
                "device": "cuda", "device_name": device, "kv_cache": self.kv_cache,
                "device_weight_bytes": weight_bytes, "device_state_bytes": self.state_bytes,
            }),
        };
        if let (Some(o), serde_json::Value::Object(extra)) = (o.as_object_mut(), extra) {
            o.extend(extra);
        }
        if let (Some(o), Some(p)) = (o.as_object_mut(), self.picks) {
            o.insert("tg_tokens_fnv64".into(), p.hex().into());
            o.insert("tg_tokens_agree".into(), p.agree.into());
        }
        o
    }

    /// The table and notes for people.
    pub fn table(&self) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let name = self
            .model
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        let (col, at_where, bw_what) = match &self.place {
            Place::Cpu { threads, .. } => {
                ("threads", threads.to_string(), format!("{threads} threads"))
            }
            Place::Cuda { device, .. } => ("device", device.clone(), "the GPU".to_string()),
        };
        let at = if self.depth > 0 {
            match self.depth_fill {
                DepthFill::Zeros => format!(" @ d{} (zeros)", self.depth),
                DepthFill::Prompt => format!(" @ d{}", self.depth),
            }
        } else {
            String::new()
        };
        let mut s = format!(
            "| model | {col} | test | tok/s median | min | max |\n|---|---|---|---|---|---|\n"
        );
        for (n, runs, test) in [
            (self.n_prompt, &self.pp, "pp"),
            (self.n_gen, &self.tg, "tg"),
        ] {
            if n > 0 {
                let v = stats(runs.clone());
                s += &format!(
                    "| {name} | {at_where} | {test}{n}{at} | {:.2} | {:.2} | {:.2} |\n",
                    v.median, v.min, v.max
                );
            }
        }
        let bw = self.bandwidth();
        s += &format!(
            "\nread bandwidth: {:.1} GB/s ({bw_what}; median of {} tests, one after each decode \
             run: {:.1}–{:.1}); bytes per token: {:.3} GB\n",
            bw.median,
            self.bw_after.len(),
            bw.min,
            bw.max,
            self.bytes_per_token as f64 / 1e9
        );
        if self.n_gen > 0 {
            s += if self.host_logits {
                "decode: greedy, each step's row of logits copied to the host and picked there\n"
            } else {
                "decode: greedy, each token picked by the backend where the logits are computed \
                 (--host-logits: on the host)\n"
            };
            s += &if self.tg_warmup > 0 {
                format!(
                    "decode runs: one sequence rewound before each, after an untimed warm-up of \
                     {} tokens on it (its one-time setup, as the GPU's decode graphs)\n",
                    self.tg_warmup
                )
            } else {
                "decode runs: each on a fresh sequence, its one-time setup (the GPU's decode \
                 graphs) timed\n"
                    .to_string()
            };
            s += &format!(
                "decode floor: {:.2} tok/s; decode reaches {:.1}% of it (median over the runs, \
                 each against the tests before and after it)\n",
                self.floor(),
                100.0 * self.fraction()
            );
            if let Some(p) = self.picks {
                s += &format!(
                    "decode tokens: FNV-1a {} (the first run's), {}\n",
                    p.hex(),
                    if p.agree {
                        "the same in every run"
                    } else {
                        "NOT the same in every run: decode is not deterministic here"
                    }
                );
            }
        }
        let (kv_cache, state) = (self.kv_cache, gib(self.state_bytes));
        s += &match &self.place {
            Place::Cpu { peak_rss, simd, .. } => format!(
                "peak RSS: {:.2} GiB (file {:.2} GiB; a sequence's recurrent state and {kv_cache} \
                 KV cache {:.2} GiB at the end of a decode run)\nCPU kernels: {simd} \
                 (NIWAKI_SIMD=scalar|neon|avx2|avx512 caps them)\n",
                gib(*peak_rss),
                gib(self.file_bytes),
                state
            ),
            Place::Cuda { weight_bytes, .. } => format!(
                "device memory: weights {:.2} GiB (file {:.2} GiB), one sequence's state, {kv_cache} \
                 KV cache and scratch {:.2} GiB\n",
                gib(*weight_bytes),
                gib(self.file_bytes),
                state
            ),
        };
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(place: Place, tg: Vec<f64>, bw_after: Vec<f64>) -> Report<'static> {
        Report {
            model: Path::new("dir/m.gguf"),
            file_bytes: 3 << 30,
            place,
            kv_cache: "f32",
            state_bytes: 1 << 20,
            n_prompt: 512,
            n_gen: 128,
            depth: 0,
            depth_fill: DepthFill::Prompt,
            reps: tg.len(),
            host_logits: false,
            pp: vec![10.0, 30.0, 20.0],
            tg,
            picks: None,
            tg_warmup: 0,
            bw_after,
            bytes_per_token: 4_000_000_000,
        }
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(stats(vec![]), Stats::default());
        let s = stats(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(stats(vec![4.0, 1.0, 2.0, 3.0]).median, 2.5);
    }

    #[test]
    fn each_decode_run_is_held_against_the_tests_around_it() {
        let cpu = Place::Cpu {
            threads: 2,
            peak_rss: 1 << 30,
            simd: "avx512",
        };
        // 4 GB a token: 5 tok/s at 40 GB/s is the whole floor.
        let r = report(cpu, vec![5.0, 5.0, 2.5], vec![40.0, 20.0, 20.0]);
        let f = r.fractions();
        // Run 0 has only the test after it; run 1 the mean of 40 and 20.
        assert_eq!(f.len(), 3);
        assert!((f[0] - 0.5).abs() < 1e-12, "{f:?}");
        assert!((f[1] - 5.0 * 4.0 / 30.0).abs() < 1e-12, "{f:?}");
        assert!((f[2] - 0.5).abs() < 1e-12, "{f:?}");
        assert!((r.floor() - 5.0).abs() < 1e-12);
        // With no test, no floor to hold a run against.
        let none = report(
            Place::Cpu {
                threads: 1,
                peak_rss: 0,
                simd: "scalar",
            },
            vec![5.0],
            vec![],
        );
        assert_eq!(none.fractions(), vec![0.0]);
    }

    #[test]
    fn the_decode_picks_are_reported_and_runs_that_differ_are_called_out() {
        let cpu = Place::Cpu {
            threads: 2,
            peak_rss: 1 << 30,
            simd: "avx2",
        };
        let mut r = report(cpu, vec![5.0, 6.0], vec![30.0, 30.0]);
        let t = r.table();
        assert!(!t.contains("decode tokens"), "{t}");
        assert!(r.json().get("tg_tokens_fnv64").is_none());
        r.picks = super::super::picks::Picks::of(&[vec![1, 2, 3], vec![1, 2, 3]]);
        let (t, j) = (r.table(), r.json());
        let hex = r.picks.map(|p| p.hex()).unwrap_or_default();
        assert!(t.contains(&format!("decode tokens: FNV-1a {hex}")), "{t}");
        assert!(t.contains("the same in every run"), "{t}");
        assert_eq!(j["tg_tokens_fnv64"], hex.as_str());
        assert_eq!(j["tg_tokens_agree"], true);
        r.picks = super::super::picks::Picks::of(&[vec![1, 2, 3], vec![1, 2, 4]]);
        assert!(r.table().contains("NOT the same in every run"));
        assert_eq!(r.json()["tg_tokens_agree"], false);
    }

    #[test]
    fn the_gpu_report_names_the_device_and_its_memory() {
        let gpu = Place::Cuda {
            device: "NVIDIA H200".into(),
            weight_bytes: 7 << 30,
        };
        let mut r = report(gpu, vec![270.0, 280.0, 275.0], vec![4000.0, 4000.0, 4000.0]);
        r.kv_cache = "q8_0";
        r.state_bytes = 1 << 29;
        let t = r.table();
        assert!(
            t.contains("| m.gguf | NVIDIA H200 | tg128 | 275.00 | 270.00 | 280.00 |"),
            "{t}"
        );
        assert!(
            t.contains("| m.gguf | NVIDIA H200 | pp512 | 20.00 |"),
            "{t}"
        );
        // 275 tok/s × 4 GB against 4000 GB/s.
        assert!(t.contains("decode reaches 27.5% of it"), "{t}");
        assert!(
            t.contains("weights 7.00 GiB") && t.contains("q8_0 KV cache and scratch 0.50 GiB"),
            "{t}"
        );
        let j = r.json();
        assert_eq!(j["device"], "cuda");
        assert_eq!(j["device_name"], "NVIDIA H200");
        assert_eq!(j["tg_tok_s"], 275.0);
        assert!((j["floor_fraction"].as_f64().unwrap_or(0.0) - 0.275).abs() < 1e-12);
        assert_eq!(j["device_weight_bytes"], 7u64 << 30);
        // Where decode picked its tokens, in both forms.
        assert!(t.contains("each token picked by the backend"), "{t}");
        assert_eq!(j["tg_pick"], "backend");
        r.host_logits = true;
        assert!(r.table().contains("row of logits copied to the host"));
        assert_eq!(r.json()["tg_pick"], "host_logits");
    }

    #[test]
    fn the_cpu_report_keeps_the_keys_the_side_by_side_script_reads() {
        let cpu = Place::Cpu {
            threads: 2,
            peak_rss: 3 << 30,
            simd: "avx2",
        };
        let mut r = report(cpu, vec![5.0], vec![40.0]);
        r.kv_cache = "f16";
        r.state_bytes = 5 << 20;
        let j = r.json();
        for key in [
            "pp_tok_s",
            "tg_tok_s",
            "peak_rss_bytes",
            "read_bw_gbs",
            "floor_fraction",
            "floor_tok_s",
            "threads",
            "simd",
        ] {
            assert!(j.get(key).is_some(), "{key} missing from {j}");
        }
        assert_eq!(j["device"], "cpu");
        assert_eq!(j["simd"], "avx2");
        assert_eq!(j["kv_cache"], "f16");
        assert_eq!(j["state_bytes"], 5u64 << 20);
        assert_eq!(j["pp_tok_s"], 20.0);
    }
}
