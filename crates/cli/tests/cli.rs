//! The `niwaki` binary end to end, on small synthetic models in temp directories.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn niwaki() -> Command {
    Command::cargo_bin("niwaki").unwrap()
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures")
        .join(rel)
}

fn synth(dir: &Path, name: &str, format: &str) -> PathBuf {
    let path = dir.join(name);
    niwaki()
        .args([
            "synth", "--preset", "tiny", "--format", format, "--seed", "3", "--model",
        ])
        .arg(&path)
        .assert()
        .success();
    path
}

/// Four greedy tokens from `m` on the CPU; the text printed.
fn greedy_few(m: &Path) -> String {
    stdout(
        niwaki()
            .args([
                "run",
                "--temperature",
                "0",
                "-n",
                "4",
                "--prompt",
                "hi",
                "--model",
            ])
            .arg(m),
    )
}

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(out).unwrap()
}

fn failure(cmd: &mut Command) -> String {
    let out = cmd.assert().failure().get_output().clone();
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn tokenize_works_on_a_vocabulary_only_file() {
    let out = stdout(
        niwaki()
            .args(["tokenize", "--model"])
            .arg(fixture("tokenizer/qwen35-vocab.gguf"))
            .arg("<|im_start|>user\nHi<|im_end|>"),
    );
    let ids: Vec<u32> = serde_json::from_str(out.trim()).unwrap();
    // From the tiktoken reference (fixtures/tokenizer/encode.json).
    assert_eq!(ids, vec![248045, 846, 198, 12675, 248046]);
}

#[test]
fn greedy_runs_are_identical_and_respect_max_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let run = || {
        let out = niwaki()
            .args([
                "run",
                "--temperature",
                "0",
                "-n",
                "24",
                "--prompt",
                "Hello there",
                "--model",
            ])
            .arg(&m)
            .assert()
            .success()
            .get_output()
            .clone();
        (out.stdout, String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (a, err) = run();
    let (b, _) = run();
    assert_eq!(a, b);
    assert!(
        err.contains("generated: 24 tokens") && err.contains("Length"),
        "{err}"
    );
}

#[test]
fn thread_count_does_not_change_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let run = |threads: &str| {
        stdout(
            niwaki()
                .args([
                    "run",
                    "--temperature",
                    "0",
                    "-n",
                    "16",
                    "--threads",
                    threads,
                    "--prompt",
                    "abc",
                    "--model",
                ])
                .arg(&m),
        )
    };
    assert_eq!(run("1"), run("2"));
}

/// `cmd` with the kernels capped at `simd` (`None`: uncapped, whatever the test's environment).
fn capped<'a>(cmd: &'a mut Command, simd: Option<&str>) -> &'a mut Command {
    match simd {
        Some(level) => cmd.env("NIWAKI_SIMD", level),
        None => cmd.env_remove("NIWAKI_SIMD"),
    }
}

/// The logits of `tokens` from `m` (`--mode step` one token at a time, `prefill` as one chunk),
/// with the kernels capped at `simd` (`None`: the fastest the CPU has), as the .npy bytes.
fn logits_bytes(m: &Path, dir: &Path, mode: &str, simd: Option<&str>) -> Vec<u8> {
    let out = dir.join(format!("{mode}-{}.npy", simd.unwrap_or("best")));
    let mut cmd = niwaki();
    cmd.args(["logits", "--tokens", "5,17,3,99,42,7,250,1,64,128,33,2"])
        .args(["--mode", mode, "--out"])
        .arg(&out)
        .arg("--model")
        .arg(m);
    capped(&mut cmd, simd).assert().success();
    std::fs::read(&out).unwrap()
}

/// Greedy text from `m` with the kernels capped at `simd`.
fn greedy_capped(m: &Path, simd: Option<&str>) -> String {
    let mut cmd = niwaki();
    cmd.args(["run", "--temperature", "0", "-n", "12", "--prompt", "abc"])
        .arg("--model")
        .arg(m);
    stdout(capped(&mut cmd, simd))
}

/// The caps below the CPU's best that the kernel tests compare it with: scalar, and on x86
/// AVX2 (on an AVX-512 CPU, the AVX2 kernels).
const LOWER_CAPS: &[&str] = if cfg!(target_arch = "x86_64") {
    &["scalar", "avx2"]
} else {
    &["scalar"]
};

/// Every SIMD kernel of the int8 path on the Bonsai formats (tiled GEMMs, activation
/// quantization, attention) has a scalar twin that gives the same bits: whole-model logits,
/// decoded step by step and prefilled as a chunk, are byte-identical with the kernels capped at
/// scalar, at AVX2 (on x86) and uncapped, and so is greedy output. On synthetic models of all
/// five formats and the oracle's Q1_0 and Q2_0 fixtures.
#[test]
fn scalar_and_simd_kernels_give_identical_logits_and_greedy_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut models: Vec<(String, PathBuf)> = ["Q1_0", "Q2_0", "Q2_0_g128", "PQ2_0", "PTQ1_0"]
        .into_iter()
        .map(|f| (f.to_string(), synth(dir.path(), &format!("{f}.gguf"), f)))
        .collect();
    for f in ["tiny-exact-q1.Q1_0.gguf", "tiny-exact-q2g64.Q2_0.gguf"] {
        models.push((f.to_string(), fixture(&format!("oracle/{f}"))));
    }
    for (name, m) in &models {
        for mode in ["step", "prefill"] {
            let best = logits_bytes(m, dir.path(), mode, None);
            for &level in LOWER_CAPS {
                let capped = logits_bytes(m, dir.path(), mode, Some(level));
                assert!(
                    capped == best,
                    "{name} {mode}: logits with NIWAKI_SIMD={level} differ"
                );
            }
        }
        assert_eq!(
            greedy_capped(m, Some("scalar")),
            greedy_capped(m, None),
            "{name}: greedy text"
        );
    }
}

/// Float-weight matrices (F16, F32) sum their rows in another order on AVX-512 than the scalar
/// dot (within the bound `quant`'s tests hold them to), so their logits may differ in the last
/// bits; greedy text on the oracle's float fixtures is still the same.
#[test]
fn float_weight_fixtures_give_identical_greedy_text_on_every_simd_level() {
    for f in ["tiny-exact-t128.gguf", "tiny-f32.gguf"] {
        let m = fixture(&format!("oracle/{f}"));
        let best = greedy_capped(&m, None);
        for &level in LOWER_CAPS {
            assert_eq!(greedy_capped(&m, Some(level)), best, "{f} at {level}");
        }
    }
}

#[test]
fn a_bad_simd_cap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let err = failure(
        niwaki()
            .env("NIWAKI_SIMD", "sse4")
            .args(["info", "--model"])
            .arg(&m),
    );
    assert!(err.contains("NIWAKI_SIMD") && err.contains("sse4"), "{err}");
}

#[test]
fn bench_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let out = stdout(
        niwaki()
            .args([
                "bench",
                "--json",
                "-p",
                "8",
                "-n",
                "4",
                "-r",
                "2",
                "--bw-bytes",
                "16777216",
                "--model",
            ])
            .arg(&m),
    );
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    for key in [
        "pp_tok_s",
        "tg_tok_s",
        "peak_rss_bytes",
        "read_bw_gbs",
        "floor_fraction",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    // A bandwidth test after each of the two decode runs, and each run's own fraction.
    for key in ["read_bw_tests_gbs", "floor_fraction_runs"] {
        let runs = v[key].as_array().unwrap_or_else(|| panic!("{key}: {v}"));
        assert_eq!(runs.len(), 2, "{key}: {v}");
        assert!(runs.iter().all(|x| x.as_f64().is_some_and(|x| x > 0.0)));
    }
    // The two decode runs picked the same tokens (greedy decode is deterministic), named by
    // their digest.
    assert_eq!(v["tg_tokens_agree"], true, "{v}");
    assert_eq!(v["tg_tokens_fnv64"].as_str().map(str::len), Some(16), "{v}");
    // The CPU rewinds a sequence, so the runs share one, warmed up untimed first.
    assert_eq!(v["tg_warmup_tokens"], 2, "{v}");
}

#[test]
fn bench_at_depth_counts_the_cache_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let bench = |depth: &str, kv: &str| -> serde_json::Value {
        let out = stdout(
            niwaki()
                .args(["bench", "--json", "-p", "0", "-n", "2", "-r", "1"])
                .args([
                    "--bw-bytes",
                    "16777216",
                    "-d",
                    depth,
                    "--kv-cache",
                    kv,
                    "--model",
                ])
                .arg(&m),
        );
        serde_json::from_str(out.trim()).unwrap()
    };
    let (flat, deep) = (bench("0", "f32"), bench("64", "f32"));
    assert_eq!(deep["n_depth"], 64, "{deep}");
    assert_eq!(deep["kv_cache"], "f32", "{deep}");
    assert!(deep["tg_tok_s"].as_f64().is_some_and(|x| x > 0.0), "{deep}");
    // The same weights and state, and 64 more cached positions of keys and values.
    let bytes = |v: &serde_json::Value| v["bytes_per_token"].as_u64().unwrap();
    let extra = bytes(&deep) - bytes(&flat);
    assert!(extra > 0 && extra % 64 == 0, "{extra}");
    // The state the decode runs held: 64 positions' keys and values more at depth 64.
    let state = |v: &serde_json::Value| v["state_bytes"].as_u64().unwrap();
    let held = state(&deep) - state(&flat);
    assert!(held > 0 && held % 64 == 0, "{held}");
    // An f16 cache holds and reads half the bytes at the same depth.
    let (flat16, deep16) = (bench("0", "f16"), bench("64", "f16"));
    assert_eq!(deep16["kv_cache"], "f16", "{deep16}");
    assert_eq!(2 * (bytes(&deep16) - bytes(&flat16)), extra);
    assert_eq!(2 * (state(&deep16) - state(&flat16)), held);
    // A depth past the model's context is refused.
    let out = niwaki()
        .args(["bench", "-p", "0", "-n", "2", "-d", "100000000", "--model"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exceed the context"));
}

#[test]
fn bench_fills_its_depth_by_a_prefill_unless_told_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let bench = |fill: &[&str]| {
        let out = niwaki()
            .args([
                "bench", "--json", "-p", "4", "-n", "6", "-r", "2", "-d", "48",
            ])
            .args(["--bw-bytes", "16777216"])
            .args(fill)
            .arg("--model")
            .arg(&m)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        (v, String::from_utf8_lossy(&out.stderr).to_string())
    };
    // As llama-bench's: each test (prefill and decode) starts from 48 prefilled positions. The
    // CPU fills them once and rewinds the state to them before each test: the two decode runs,
    // one after the prefill runs and one after the other decode run, pick the same tokens.
    let (v, err) = bench(&[]);
    assert_eq!(v["depth_fill"], "prompt", "{v}");
    assert_eq!(
        err.matches("depth 48 filled by a prefill").count(),
        1,
        "{err}"
    );
    assert_eq!(v["tg_tokens_agree"], true, "{v}");
    let (v, err) = bench(&["--depth-fill", "zeros"]);
    assert_eq!(v["depth_fill"], "zeros", "{v}");
    assert!(!err.contains("filled by a prefill"), "{err}");
    assert_eq!(v["n_depth"], 48, "{v}");
}

#[test]
fn bench_runs_each_value_of_its_lists_as_a_test_and_one_load_gives_what_single_runs_give() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let bench = |p: &str, n: &str, d: &str| -> (Vec<serde_json::Value>, String) {
        let out = niwaki()
            .args(["bench", "--json", "-r", "1", "--bw-bytes", "16777216"])
            .args(["-p", p, "-n", n, "-d", d, "--model"])
            .arg(&m)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines, String::from_utf8_lossy(&out.stderr).to_string())
    };
    let (tests, err) = bench("2,0,6", "3,5", "0,24");
    let shape: Vec<_> = tests
        .iter()
        .map(|v| {
            (
                v["n_depth"].clone(),
                v["n_prompt"].clone(),
                v["n_gen"].clone(),
            )
        })
        .collect();
    let t = |d: u64, p: u64, n: u64| (d.into(), p.into(), n.into());
    assert_eq!(
        shape,
        [
            t(0, 2, 0),
            t(0, 6, 0),
            t(0, 0, 3),
            t(0, 0, 5),
            t(24, 2, 0),
            t(24, 6, 0),
            t(24, 0, 3),
            t(24, 0, 5)
        ]
    );
    // Each test measured only its own half, and each depth was filled once.
    for v in &tests {
        let (p, n) = (
            v["n_prompt"].as_u64().unwrap(),
            v["n_gen"].as_u64().unwrap(),
        );
        assert_eq!(v["pp_tok_s"].as_f64().unwrap() > 0.0, p > 0, "{v}");
        assert_eq!(v["tg_tok_s"].as_f64().unwrap() > 0.0, n > 0, "{v}");
    }
    assert_eq!(
        err.matches("depth 24 filled by a prefill").count(),
        1,
        "{err}"
    );
    // A decode test in the list picks what the same test alone picks: its depth's tokens and its
    // first token come from the longest prompt's draw, as a single run's do.
    let (alone, _) = bench("6", "5", "24");
    assert_eq!(alone.len(), 1);
    assert_eq!(tests[7]["tg_tokens_fnv64"], alone[0]["tg_tokens_fnv64"]);
    assert!(alone[0]["pp_tok_s"].as_f64().unwrap() > 0.0);
    // A list whose tests exceed the context is refused before anything runs.
    let out = niwaki()
        .args([
            "bench",
            "-p",
            "1,2",
            "-n",
            "2",
            "-d",
            "8,100000000",
            "--model",
        ])
        .arg(&m)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exceed the context"));
}

#[test]
fn lookup_drafting_leaves_greedy_output_as_it_was_and_says_when_it_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let run = |extra: &[&str]| {
        let mut c = niwaki();
        c.args(["run", "-n", "40", "--prompt", "ab ab ab ab ab ab ab"])
            .args(extra)
            .arg("--model")
            .arg(&m);
        c
    };
    let plain = stdout(&mut run(&["--temperature", "0"]));
    assert!(!plain.trim().is_empty());
    assert_eq!(plain, stdout(&mut run(&["--temperature", "0", "--lookup"])));
    let out = run(&["--temperature", "0.6", "--lookup"]).output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--lookup is ignored") && err.contains("greedy"),
        "{err}"
    );
}

#[test]
fn the_cpu_runs_an_f16_kv_cache_and_refuses_the_gpus_q8_0() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let run = |kv: &str, n: &str| {
        let mut c = niwaki();
        c.args(["run", "--temperature", "0", "-n", n, "--prompt", "hi"])
            .args(["--kv-cache", kv, "--model"])
            .arg(&m);
        c
    };
    let (exact, half) = (stdout(&mut run("f32", "8")), stdout(&mut run("f16", "8")));
    assert!(!half.trim().is_empty());
    // The default is the f32 cache.
    assert_eq!(greedy_few(&m), stdout(&mut run("f32", "4")));
    assert_eq!(exact, stdout(&mut run("f32", "8")));
    let e = failure(&mut run("q8_0", "8"));
    assert!(e.contains("--device cuda"), "{e}");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "PTQ1_0");
    let run = |seed: &str| {
        stdout(
            niwaki()
                .args([
                    "run",
                    "--temperature",
                    "1",
                    "--seed",
                    seed,
                    "-n",
                    "16",
                    "--prompt",
                    "abc",
                    "--model",
                ])
                .arg(&m),
        )
    };
    assert_eq!(run("5"), run("5"));
}

#[test]
fn reaching_the_context_limit_keeps_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let out = niwaki()
        .args([
            "run",
            "--temperature",
            "0",
            "--ctx",
            "16",
            "-n",
            "100",
            "--prompt",
            "0123456789",
            "--model",
        ])
        .arg(&m)
        .assert()
        .success()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("context limit of 16 tokens reached") && err.contains("ContextFull"),
        "{err}"
    );
    assert!(err.contains("generated: 7 tokens"), "{err}");
    assert!(!out.stdout.is_empty());
}

#[test]
fn over_long_and_empty_prompts_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let msg = failure(
        niwaki()
            .args(["run", "--ctx", "8", "--prompt", "0123456789", "--model"])
            .arg(&m),
    );
    assert!(
        msg.contains("10 tokens") && msg.contains("context holds 8"),
        "{msg}"
    );
    let msg = failure(niwaki().args(["run", "--prompt", "", "--model"]).arg(&m));
    assert!(msg.contains("empty"), "{msg}");
}

#[test]
fn out_of_range_token_ids_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let out = dir.path().join("l.npy");
    let msg = failure(
        niwaki()
            .args(["logits", "--tokens", "1,99999", "--out"])
            .arg(&out)
            .arg("--model")
            .arg(&m),
    );
    assert!(
        msg.contains("99999") && msg.contains("outside the vocabulary"),
        "{msg}"
    );
}

#[test]
fn logits_in_prefill_and_step_mode_agree_and_perplexity_compares_them() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let a = dir.path().join("a.npy");
    let b = dir.path().join("b.npy");
    for (mode, out) in [("prefill", &a), ("step", &b)] {
        niwaki()
            .args([
                "logits",
                "--tokens",
                "5,6,7,8,9,10",
                "--mode",
                mode,
                "--out",
            ])
            .arg(out)
            .arg("--model")
            .arg(&m)
            .assert()
            .success();
    }
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let json = stdout(
        niwaki()
            .args([
                "perplexity",
                "--json",
                "--tokens",
                "5,6,7,8,9,10",
                "--kl-base",
            ])
            .arg(&a)
            .arg("--model")
            .arg(&m),
    );
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(v["mean_kl"].as_f64(), Some(0.0));
    assert_eq!(v["top1"].as_f64(), Some(1.0));
    assert!(v["perplexity"].as_f64().unwrap() > 1.0);
}

#[test]
fn validate_accepts_a_good_file_and_info_describes_it() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "PQ2_0");
    assert!(stdout(niwaki().args(["validate", "--model"]).arg(&m)).contains("OK"));
    let info = stdout(niwaki().args(["info", "--model"]).arg(&m));
    assert!(
        info.contains("qwen35")
            && info.contains("PQ2_0")
            && info.contains("3 gated delta net, 1 gated attention"),
        "{info}"
    );
}

/// Finds a tensor's data in a file written by `synth` (via the library, to corrupt it).
fn tensor_range(path: &Path, name: &str) -> (usize, usize) {
    let g = gguf::Gguf::open(path).unwrap();
    let t = g.tensors().iter().find(|t| t.name == name).unwrap();
    (t.offset as usize, t.size as usize)
}

#[test]
fn validate_reports_code_3_and_non_finite_scales() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let (off, _) = tensor_range(&m, "blk.0.ffn_up.weight");
    let mut bytes = std::fs::read(&m).unwrap();
    bytes[off + 2] = 0xff; // four codes of 3 in the first block
    bytes[off + 18..off + 20].copy_from_slice(&0x7e00u16.to_le_bytes()); // NaN scale of the second block
    std::fs::write(&m, &bytes).unwrap();
    let msg = failure(niwaki().args(["validate", "--model"]).arg(&m));
    assert!(
        msg.contains("blk.0.ffn_up.weight") && msg.contains("4 codes equal 3"),
        "{msg}"
    );
    assert!(msg.contains("1 non-finite block scales"), "{msg}");
}

#[test]
fn truncated_and_foreign_files_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let bytes = std::fs::read(&m).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let msg = failure(niwaki().args(["validate", "--model"]).arg(&cut));
    assert!(
        msg.contains("INVALID") && msg.contains("truncated"),
        "{msg}"
    );
    let msg = failure(niwaki().args(["run", "--prompt", "x", "--model"]).arg(&cut));
    assert!(msg.contains("cut.gguf"), "{msg}");
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"PK\x03\x04 definitely not a model").unwrap();
    let msg = failure(niwaki().args(["info", "--model"]).arg(&junk));
    assert!(msg.contains("not a GGUF file"), "{msg}");
}

#[test]
fn quantize_repacks_and_the_result_still_runs() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q2_0");
    let out = dir.path().join("legacy.gguf");
    niwaki()
        .args(["quantize", "--format", "Q2_0_g128", "--out"])
        .arg(&out)
        .arg("--model")
        .arg(&m)
        .assert()
        .success();
    let info = stdout(niwaki().args(["info", "--model"]).arg(&out));
    assert!(info.contains("Q2_0_g128"), "{info}");
    greedy_few(&out);
}

#[test]
fn chat_answers_over_stdin_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let out = niwaki()
        .args(["chat", "--temperature", "0", "-n", "8", "--model"])
        .arg(&m)
        .write_stdin("hello\nand again\n/exit\n")
        .assert()
        .success()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("generated:").count(), 2, "{err}");
}

/// A greedy chat of up to `n` tokens a reply with the oracle model (whose replies depend on
/// what came before; a random one's hardly do) over `stdin`: its stdout and stderr.
fn oracle_chat(n: &str, extra: &[&str], stdin: &str) -> (String, String) {
    let out = niwaki()
        .args(["chat", "--temperature", "0", "-n", n])
        .args(extra)
        .arg("--model")
        .arg(fixture("oracle/tiny-exact-q1.Q1_0.gguf"))
        .write_stdin(stdin.to_string())
        .assert()
        .success()
        .get_output()
        .clone();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (text(&out.stdout), text(&out.stderr))
}

#[test]
fn chat_after_a_reset_answers_as_at_the_start() {
    let (text, _) = oracle_chat("8", &[], "hello\n/reset\nhello\n/exit\n");
    // Each reply is followed by a newline: the same reply twice is two equal halves.
    let (first, second) = text.split_at(text.len() / 2);
    assert!(!first.trim().is_empty(), "{text:?}");
    assert_eq!(first, second, "{text:?}");
}

#[test]
fn chat_reuses_its_state_across_turns_and_replies_as_from_the_start() {
    let chat = |extra: &[&str]| {
        let (out, err) = oracle_chat("12", extra, "hello\nand again\nthird one\n/exit\n");
        // Each turn's prompt tokens and those of them fed, as the report after it says
        // ("prompt: N tokens (M already held), …").
        let (prompts, fed): (Vec<usize>, Vec<usize>) = err
            .split("prompt: ")
            .skip(1)
            .filter_map(|s| {
                let n: usize = s.split(' ').next()?.parse().ok()?;
                let held = match s.split_once(" tokens (") {
                    Some((_, r)) => r.split(' ').next()?.parse().ok()?,
                    None => 0,
                };
                Some((n, n - held))
            })
            .unzip();
        (out, prompts, fed)
    };
    let (reused, prompts, fed) = chat(&[]);
    let (fresh, fresh_prompts, whole) = chat(&["--fresh-turns"]);
    assert_eq!(reused, fresh);
    assert_eq!(prompts, fresh_prompts);
    assert_eq!((fed.len(), whole.len()), (3, 3), "{fed:?} {whole:?}");
    // The first turn is the whole prompt either way; later ones feed less than the whole
    // conversation (the template drops the earlier reply's opening, so the state goes back to
    // the end of the earlier history rather than to the start).
    assert_eq!(fed[0], whole[0]);
    assert!(fed[1] < whole[1] && fed[2] < whole[2], "{fed:?} {whole:?}");
}

#[test]
fn synth_marks_a_model_hadamard_folded_where_its_widths_allow() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.gguf");
    let synth_rot = |preset: &str| {
        let mut c = niwaki();
        c.args([
            "synth",
            "--preset",
            preset,
            "--format",
            "Q2_0",
            "--hadamard",
            "--model",
        ])
        .arg(&path);
        c
    };
    let msg = failure(&mut synth_rot("tiny"));
    assert!(msg.contains("multiples of 1024"), "{msg}");
    synth_rot("small").assert().success();
    let info = stdout(niwaki().args(["info", "--model"]).arg(&path));
    assert!(info.contains("hadamard:      yes"), "{info}");
    // The CPU engine runs it (rotating on the fly).
    assert!(!greedy_few(&path).is_empty());
}

#[test]
fn compiling_the_kernels_ahead_needs_the_cuda_build_or_says_what_it_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let m = synth(dir.path(), "t.gguf", "Q1_0");
    let mut c = niwaki();
    c.env("NIWAKI_CUDA_CACHE", dir.path().join("kernels"))
        .args(["kernels", "--arch", "sm_77", "--model"])
        .arg(&m);
    let e = failure(&mut c);
    // Built without the backend: it says so; with it: the architecture's shared memory is
    // unknown and has to be given.
    if cfg!(feature = "cuda") {
        assert!(e.contains("--smem-kib"), "{e}");
    } else {
        assert!(e.contains("--features cuda"), "{e}");
    }
    assert!(!dir.path().join("kernels").exists());
}
