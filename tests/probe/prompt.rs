//! Needle prompts on the REAL tokenizer: exact length, exact needle and answer spans (decoded
//! back), the V4 chat format, placement by depth, determinism and clear errors.

use needlescope::probe::prompt::{build_prompt, NeedlePrompt, PromptError};
use needlescope::probe::scenario::Scenario;
use needlescope::tokenizer::V4Tokenizer;

const MAX: usize = 1 << 20;

fn tok() -> V4Tokenizer {
    V4Tokenizer::builtin().expect("built-in tokenizer loads")
}

fn essay_file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("essay.txt");
    let text =
        "Rivers were the first roads. They carried grain, stone and news long before anyone \
                paved a path!\n\nA town grew wherever a ford met a market. Some of those towns \
                are cities now; others are a name on an old map. \"Why?\" a child once asked.\n";
    std::fs::write(&path, text).unwrap();
    path
}

fn scenario(name: &str, dir: &tempfile::TempDir) -> Scenario {
    let sc = Scenario::load(name).unwrap();
    if name == "essay" {
        sc.with_haystack_file(&essay_file(dir)).unwrap()
    } else {
        sc
    }
}

fn custom(needle: &str, value: &str) -> Scenario {
    let text = format!(
        "name = \"custom\"\nneedle = \"{needle}\"\nquestion = \"What is it?\"\n{value}\n[haystack]\nkind = \"noise\"\n"
    );
    Scenario::from_toml_str(&text, "test.toml", None).unwrap()
}

/// Every invariant a prompt promises, with messages that show the first difference.
fn check_prompt(t: &V4Tokenizer, p: &NeedlePrompt, target: usize, thinking: bool) {
    assert_eq!(p.tokens.len(), target, "prompt length");
    assert_eq!(
        t.encode(&p.prompt_text).unwrap(),
        p.tokens,
        "tokens re-encode from prompt_text"
    );
    assert_eq!(t.decode(&p.tokens).unwrap(), p.prompt_text);
    assert_eq!(p.tokens[0], 0, "BOS first");
    let last = if thinking { 128821 } else { 128822 };
    assert_eq!(
        &p.tokens[target - 2..],
        &[128804, last],
        "ends with <｜Assistant｜> and the think marker"
    );

    let (a, b) = p.needle;
    assert!(a < b && b <= target);
    let needle = t.decode(&p.tokens[a..b]).unwrap();
    assert_eq!(needle, p.needle_span_text);
    assert_eq!(
        needle.trim(),
        p.needle_text,
        "needle span decodes to the needle text"
    );
    let lead = &needle[..needle.len() - needle.trim_start().len()];
    assert!(lead.is_empty() || lead == " ", "glued lead {lead:?}");
    assert!(
        needle.trim_start().trim_end_matches('\n') == p.needle_text,
        "only newlines glued after: {needle:?}"
    );
    // One token less on either side loses needle text.
    assert_ne!(t.decode(&p.tokens[a + 1..b]).unwrap().trim(), p.needle_text);
    assert_ne!(t.decode(&p.tokens[a..b - 1]).unwrap().trim(), p.needle_text);

    let (aa, ab) = p.answer;
    assert!(
        a <= aa && aa < ab && ab <= b,
        "answer span {:?} inside needle {:?}",
        p.answer,
        p.needle
    );
    let answer = t.decode(&p.tokens[aa..ab]).unwrap();
    assert_eq!(answer, p.answer_span_text);
    assert_eq!(
        answer.trim(),
        p.answer_value,
        "answer span decodes to the value"
    );
    assert_eq!(
        p.prompt_text.matches(&p.answer_value).count(),
        1,
        "value occurs once"
    );
}

#[test]
fn needle_and_answer_spans_are_exact_at_depth_0_50_100_for_every_scenario() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for name in Scenario::builtin_names() {
        let sc = scenario(name, &dir);
        for depth in [0.0, 50.0, 100.0] {
            let p = build_prompt(&t, &sc, 1500, depth, 11, MAX)
                .unwrap_or_else(|e| panic!("{name} depth {depth}: {e}"));
            check_prompt(&t, &p, 1500, sc.thinking);
            assert!(
                (p.actual_depth_pct - depth).abs() <= 15.0,
                "{name}: depth {depth} placed at {}",
                p.actual_depth_pct
            );
        }
    }
}

#[test]
fn depth_0_puts_the_needle_right_after_the_user_marker_and_100_right_before_the_question() {
    let t = tok();
    let sc = Scenario::load("passkey").unwrap();
    let p0 = build_prompt(&t, &sc, 1200, 0.0, 3, MAX).unwrap();
    assert_eq!(
        p0.tokens[p0.needle.0 - 1],
        128803,
        "token before the needle is <｜User｜>"
    );
    assert_eq!(p0.actual_depth_pct, 0.0);
    let p100 = build_prompt(&t, &sc, 1200, 100.0, 3, MAX).unwrap();
    let after = t.decode(&p100.tokens[p100.needle.1..]).unwrap();
    assert!(after.starts_with("What is the pass key?"), "{after:?}");
    assert_eq!(p100.actual_depth_pct, 100.0);
}

#[test]
fn a_mid_depth_needle_sits_at_a_sentence_boundary() {
    let t = tok();
    let p = build_prompt(&t, &Scenario::load("passkey").unwrap(), 3000, 40.0, 8, MAX).unwrap();
    let before = t.decode(&p.tokens[p.needle.0 - 1..p.needle.0]).unwrap();
    assert!(before.ends_with('.'), "token before the needle: {before:?}");
    assert!(
        p.needle_span_text.starts_with(' '),
        "{:?}",
        p.needle_span_text
    );
}

#[test]
fn seven_and_ten_digit_values_cover_every_one_to_three_digit_group() {
    let t = tok();
    for (n, groups) in [(7, 3), (10, 4), (1, 1), (3, 1), (4, 2)] {
        let sc = custom(
            "The code is {value}.",
            &format!("[value]\nkind = \"digits\"\nn = {n}"),
        );
        let p = build_prompt(&t, &sc, 600, 50.0, 5, MAX).unwrap();
        check_prompt(&t, &p, 600, false);
        assert_eq!(p.answer_value.len(), n);
        assert_eq!(
            p.answer.1 - p.answer.0,
            groups,
            "{n} digits -> {groups} tokens: {:?}",
            p.answer_span_text
        );
        for id in &p.tokens[p.answer.0..p.answer.1] {
            let piece = t.decode(&[*id]).unwrap();
            assert!(
                (1..=3).contains(&piece.len()) && piece.chars().all(|c| c.is_ascii_digit()),
                "{piece:?}"
            );
        }
    }
}

#[test]
fn unicode_values_with_accents_and_cjk_give_exact_spans() {
    let t = tok();
    let lists = [
        "words = [\"café\", \"montréal\", \"naïve\", \"façade\"]\nsep = \"-\"",
        "words = [\"北京\", \"花园\", \"東京\", \"大阪\"]\nsep = \"\"",
        "words = [\"Ångström\", \"smörgåsbord\", \"jalapeño\"]\nsep = \" \"",
    ];
    for list in lists {
        let sc = custom(
            "The secret phrase is {value}.",
            &format!("[value]\nkind = \"words\"\nn = 2\n{list}"),
        );
        for depth in [0.0, 60.0, 100.0] {
            let p = build_prompt(&t, &sc, 700, depth, 21, MAX)
                .unwrap_or_else(|e| panic!("{list}: {e}"));
            check_prompt(&t, &p, 700, false);
            assert!(!p.answer_value.is_ascii(), "{}", p.answer_value);
        }
    }
}

#[test]
fn uuid_values_and_key_value_needles_give_exact_spans() {
    let t = tok();
    let sc = custom(
        "Ticket {value} is the one to reopen.",
        "[value]\nkind = \"uuid\"",
    );
    let p = build_prompt(&t, &sc, 900, 30.0, 2, MAX).unwrap();
    check_prompt(&t, &p, 900, false);
    assert_eq!(p.answer_value.len(), 36);

    let kv = Scenario::load("kv-retrieval").unwrap();
    let p = build_prompt(&t, &kv, 2500, 65.0, 4, MAX).unwrap();
    check_prompt(&t, &p, 2500, false);
    assert!(p.question.contains(&p.key) && !p.key.is_empty());
    assert_eq!(
        p.prompt_text.matches(&p.key).count(),
        2,
        "key in the needle and the question only"
    );
    // A long kv haystack never gives one key two values (at 16k tokens, about 2,000 lines,
    // random two-word keys used to repeat; past about 40k tokens the 2,500 two-word keys ran
    // out: here 64k tokens, about 4,000 lines of three-word keys).
    let p = build_prompt(&t, &kv, 65536, 50.0, 1, MAX).unwrap();
    let mut keys = std::collections::HashSet::new();
    let mut lines = 0;
    for line in p.prompt_text.lines() {
        if let Some(rest) = line.trim().strip_prefix("The value for key ") {
            let key = rest.split(" is ").next().unwrap().to_string();
            assert!(keys.insert(key.clone()), "key {key} on two lines");
            lines += 1;
        }
    }
    assert!(lines > 3000, "{lines} kv lines");
}

#[test]
fn prompts_have_exactly_the_requested_token_count() {
    let t = tok();
    let sc = Scenario::load("passkey").unwrap();
    for (target, depth) in [
        (300, 10.0),
        (1000, 90.0),
        (4097, 50.0),
        (8000, 25.0),
        (8001, 75.0),
    ] {
        let p = build_prompt(&t, &sc, target, depth, target as u64, MAX).unwrap();
        check_prompt(&t, &p, target, false);
    }
}

#[test]
fn lengths_near_the_minimum_are_exact_or_a_clear_error() {
    let t = tok();
    let sc = Scenario::load("passkey").unwrap();
    let min = match build_prompt(&t, &sc, 10, 50.0, 1, MAX) {
        Err(PromptError::TooShort {
            minimum, target, ..
        }) => {
            assert_eq!(target, 10);
            minimum
        }
        other => panic!("expected TooShort, got {other:?}"),
    };
    let msg = build_prompt(&t, &sc, min - 1, 50.0, 1, MAX)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(&format!("minimum length {min}")) && msg.contains("--length"),
        "{msg}"
    );
    for target in min..min + 12 {
        for depth in [0.0, 100.0] {
            let p = build_prompt(&t, &sc, target, depth, 1, MAX)
                .unwrap_or_else(|e| panic!("{target}: {e}"));
            check_prompt(&t, &p, target, false);
        }
    }
}

#[test]
fn over_max_positions_and_bad_depths_are_errors_naming_the_flag() {
    let t = tok();
    let sc = Scenario::load("passkey").unwrap();
    let msg = build_prompt(&t, &sc, 5000, 50.0, 1, 4096)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("--length 5000") && msg.contains("max_position_embeddings (4096)"),
        "{msg}"
    );
    for depth in [-1.0, 100.5, f64::NAN] {
        let msg = build_prompt(&t, &sc, 500, depth, 1, MAX)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("--depth"), "{msg}");
    }
}

#[test]
fn every_builtin_scenario_builds_at_2000_tokens() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for name in Scenario::builtin_names() {
        let sc = scenario(name, &dir);
        let p =
            build_prompt(&t, &sc, 2000, 40.0, 99, MAX).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_prompt(&t, &p, 2000, sc.thinking);
        if let Some(system) = &sc.system {
            assert!(p
                .prompt_text
                .starts_with(&format!("<｜begin▁of▁sentence｜>{system}<｜User｜>")));
        }
    }
}

#[test]
fn a_sixteen_thousand_token_prompt_is_exact() {
    let t = tok();
    let p = build_prompt(
        &t,
        &Scenario::load("code-cwd").unwrap(),
        16384,
        40.0,
        7,
        MAX,
    )
    .unwrap();
    check_prompt(&t, &p, 16384, false);
}

#[test]
fn the_same_seed_gives_the_same_ids_and_another_seed_another_needle() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for name in Scenario::builtin_names() {
        let sc = scenario(name, &dir);
        let a = build_prompt(&t, &sc, 1800, 35.0, 1234, MAX).unwrap();
        let b = build_prompt(&t, &sc, 1800, 35.0, 1234, MAX).unwrap();
        assert_eq!(a, b, "{name}");
        let c = build_prompt(&t, &sc, 1800, 35.0, 1235, MAX).unwrap();
        assert_ne!(a.answer_value, c.answer_value, "{name}");
    }
}

#[test]
fn generated_haystacks_are_not_one_sentence_repeated() {
    let t = tok();
    let p = build_prompt(&t, &Scenario::load("passkey").unwrap(), 4000, 50.0, 5, MAX).unwrap();
    let sentences: Vec<&str> = p.prompt_text.split(". ").collect();
    let distinct: std::collections::HashSet<&&str> = sentences.iter().collect();
    assert!(
        distinct.len() * 10 >= sentences.len() * 9,
        "{} of {}",
        distinct.len(),
        sentences.len()
    );
}

#[test]
fn thinking_mode_ends_the_prompt_with_think() {
    let t = tok();
    let mut sc = Scenario::load("passkey").unwrap();
    sc.thinking = true;
    let p = build_prompt(&t, &sc, 800, 50.0, 1, MAX).unwrap();
    check_prompt(&t, &p, 800, true);
    assert!(p.prompt_text.ends_with("<｜Assistant｜><think>"));
}

#[test]
fn essay_needs_a_haystack_file_and_rejects_chat_markers_in_it() {
    let t = tok();
    let msg = build_prompt(&t, &Scenario::load("essay").unwrap(), 800, 50.0, 1, MAX)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("--haystack-file") && msg.contains("essay"),
        "{msg}"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "Some text. <｜User｜> more text.").unwrap();
    let sc = Scenario::load("essay")
        .unwrap()
        .with_haystack_file(&bad)
        .unwrap();
    let msg = build_prompt(&t, &sc, 800, 50.0, 1, MAX)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("bad.txt") && msg.contains("<｜User｜>"),
        "{msg}"
    );

    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, " \n ").unwrap();
    let sc = Scenario::load("essay")
        .unwrap()
        .with_haystack_file(&empty)
        .unwrap();
    let msg = build_prompt(&t, &sc, 800, 50.0, 1, MAX)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("empty.txt") && msg.contains("no text"),
        "{msg}"
    );
}

#[test]
fn a_short_essay_file_is_repeated_to_reach_the_length() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    let p = build_prompt(&t, &scenario("essay", &dir), 3000, 50.0, 1, MAX).unwrap();
    check_prompt(&t, &p, 3000, false);
    assert!(
        p.prompt_text
            .matches("Rivers were the first roads.")
            .count()
            > 5
    );
}

/// Unit token counts are not additive (a one-word haystack line merges with its neighbours'
/// newlines), which put the needle at 20% when 30% was asked: the placement now aims past the
/// miss, so the achieved depth is within a point of the request.
#[test]
fn needle_lands_at_the_requested_depth_even_with_one_word_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("one.txt");
    std::fs::write(&path, "hello\n").unwrap();
    let sc = Scenario::load("essay")
        .unwrap()
        .with_haystack_file(&path)
        .unwrap();
    let tok = tok();
    for depth in [10.0, 30.0, 50.0, 90.0] {
        let p = build_prompt(&tok, &sc, 2048, depth, 0, MAX).unwrap();
        assert_eq!(p.tokens.len(), 2048);
        assert!(
            (p.actual_depth_pct - depth).abs() <= 1.0,
            "asked {depth}%, got {:.1}%",
            p.actual_depth_pct
        );
    }
}

/// Every added token of the tokenizer (tool-call, FIM, search, placeholder markers, `<|EOT|>`)
/// is split out of plain text as a control token; written anywhere but the chat format's own
/// places it is refused, naming the part of the prompt and where to remove it.
#[test]
fn control_tokens_in_any_text_are_refused_naming_the_part() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for (i, marker) in [
        "<｜tool▁calls▁begin｜>",
        "<|EOT|>",
        "｜DSML｜",
        "<｜▁pad▁｜>",
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.path().join(format!("inj{i}.txt"));
        std::fs::write(
            &file,
            format!("Rivers were roads. See the {marker} marker here. Towns grew at fords. "),
        )
        .unwrap();
        let sc = Scenario::load("essay")
            .unwrap()
            .with_haystack_file(&file)
            .unwrap();
        let msg = build_prompt(&t, &sc, 800, 50.0, 1, MAX)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("the haystack contains the control token")
                && msg.contains(marker)
                && msg.contains(&format!("inj{i}.txt")),
            "{msg}"
        );
    }
    for (field, toml, part) in [
        (
            "needle",
            "needle = \"Key {value}. <|EOT|>\"\nquestion = \"Key?\"",
            "needle",
        ),
        (
            "question",
            "needle = \"Key {value}.\"\nquestion = \"Key? <｜fim▁hole｜>\"",
            "question",
        ),
        (
            "system",
            "needle = \"Key {value}.\"\nquestion = \"Key?\"\nsystem = \"Hi <｜tool▁sep｜>\"",
            "system prompt",
        ),
    ] {
        let text =
            format!("name = \"c\"\n{toml}\n[value]\nkind = \"digits\"\nn = 7\n[haystack]\nkind = \"noise\"\n");
        let sc = Scenario::from_toml_str(&text, "c.toml", None).unwrap();
        let msg = build_prompt(&t, &sc, 600, 50.0, 1, MAX)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("the {part} contains the control token"))
                && msg.contains(&format!("`{field}`")),
            "{field}: {msg}"
        );
    }
}

/// A haystack file without spaces (Chinese prose, base64) is cut into small units: the prompt
/// is built from the file's own text with the needle at the requested depth, not from generated
/// filler with the needle at the start.
#[test]
fn spaceless_haystack_files_are_used_at_the_requested_depth() {
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        (
            "zh.txt",
            "河流是最早的道路。它们运送粮食和石头，也传递消息。".repeat(300),
        ),
        ("b64.txt", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo".repeat(400)),
    ] {
        let file = dir.path().join(name);
        std::fs::write(&file, &text).unwrap();
        let sc = Scenario::load("essay")
            .unwrap()
            .with_haystack_file(&file)
            .unwrap();
        for depth in [25.0, 50.0, 90.0] {
            let p = build_prompt(&t, &sc, 1024, depth, 1, MAX).unwrap();
            check_prompt(&t, &p, 1024, false);
            assert!(
                (p.actual_depth_pct - depth).abs() < 5.0,
                "{name} at {depth}: needle at {}",
                p.actual_depth_pct
            );
            let own = p.prompt_text.matches(&text[..12]).count();
            assert!(own > 10, "{name}: the file's text is in the prompt ({own})");
            // Runs of the file longer than a unit, unchanged (no space added at the cuts).
            let run: String = text.chars().take(400).collect();
            assert!(
                p.prompt_text.contains(&run),
                "{name}: the file's text is altered"
            );
        }
    }
    // A file none of whose sentences fits is an error, not a prompt of generated filler.
    let long = dir.path().join("long.txt");
    let words: Vec<String> = (0..79).map(|i| format!("word{}", i % 7)).collect();
    std::fs::write(&long, words.join(" ") + ".").unwrap();
    let sc = Scenario::load("essay")
        .unwrap()
        .with_haystack_file(&long)
        .unwrap();
    let msg = build_prompt(&t, &sc, 120, 50.0, 1, MAX)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("long.txt") && msg.contains("fits in the") && msg.contains("--length 120"),
        "{msg}"
    );
}

/// A kv haystack whose key space is too small to keep every line's key distinct (here one
/// possible key) is refused, naming the fields, instead of repeating the needle's key with
/// other values (the question would have no single answer); the built-in kv scenario is not,
/// up to 1m tokens.
#[test]
fn a_kv_haystack_that_runs_out_of_keys_is_refused() {
    let toml = r#"
name = "one-key"
needle = "The value for key {key} is {value}."
question = "What is the value for key {key}?"
[key]
kind = "words"
n = 1
words = ["alpha"]
[value]
kind = "digits"
n = 8
[haystack]
kind = "kv"
"#;
    let sc = Scenario::from_toml_str(toml, "one-key.toml", None).unwrap();
    let e = build_prompt(&tok(), &sc, 1024, 50.0, 0, MAX).unwrap_err();
    assert!(matches!(e, PromptError::KeySpaceExhausted { .. }), "{e}");
    assert!(e.to_string().contains("key.n / key.words"), "{e}");
    let kv = Scenario::load("kv-retrieval").unwrap();
    for length in [1024, 131_072, 1 << 20] {
        build_prompt(&tok(), &kv, length, 50.0, 0, MAX).unwrap();
    }
}

/// A haystack file that holds the seed's value makes the builder draw the seed's next value
/// (the same one on every run) instead of failing; a file holding every value it may draw is
/// refused, saying so.
#[test]
fn a_value_the_haystack_holds_is_redrawn_the_same_way_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let plain = scenario("essay", &dir);
    let seed = 5;
    let first = plain.generate_value_draw(seed, 0).0;
    assert_eq!(plain.generate_value(seed).0, first);
    let trap = |values: &[String]| {
        let path = dir.path().join("trap.txt");
        let text: Vec<String> = (0..60)
            .map(|i| {
                format!(
                    "Entry {i} was filed under {} by the clerk.",
                    values[i % values.len()]
                )
            })
            .collect();
        std::fs::write(&path, text.join(" ")).unwrap();
        Scenario::load("essay")
            .unwrap()
            .with_haystack_file(&path)
            .unwrap()
    };
    let sc = trap(std::slice::from_ref(&first));
    let a = build_prompt(&tok(), &sc, 400, 50.0, seed, MAX).unwrap();
    let b = build_prompt(&tok(), &sc, 400, 50.0, seed, MAX).unwrap();
    assert_ne!(a.answer_value, first);
    assert_eq!(a.answer_value, sc.generate_value_draw(seed, 1).0);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.tokens.len(), 400);
    let all: Vec<String> = (0..8)
        .map(|d| plain.generate_value_draw(seed, d).0)
        .collect();
    let err = build_prompt(&tok(), &trap(&all), 400, 50.0, seed, MAX).unwrap_err();
    assert!(matches!(err, PromptError::ValueNotUnique { draws: 8, .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("each of the 8 values drawn for this seed") && !msg.contains("--seed"),
        "{msg}"
    );
}

/// `--needles N`: N distinct needles, each span decoding to its own text, the first at the
/// depth and the others evenly spaced after it, in order; the question and the answer values
/// follow `--ask`; the prompt keeps its exact length.
#[test]
fn several_needles_are_placed_in_order_with_exact_spans_and_asked_as_told() {
    use needlescope::probe::prompt::{build_prompt_with, NeedleCount};
    use needlescope::probe::scenario::Ask;
    let t = tok();
    let dir = tempfile::tempdir().unwrap();
    for name in ["passkey", "kv-retrieval"] {
        let sc = scenario(name, &dir);
        for ask in [Ask::First, Ask::Last, Ask::All] {
            let plan = NeedleCount { count: 4, ask };
            let p = build_prompt_with(&t, &sc, 4096, 10.0, 3, MAX, plan).unwrap();
            assert_eq!(p.tokens.len(), 4096, "{name} {ask:?}");
            assert_eq!(p.needles.len(), 4);
            assert_eq!(p.needle, p.needles[0].span);
            let starts: Vec<usize> = p.needles.iter().map(|n| n.span.0).collect();
            assert!(
                starts.windows(2).all(|w| w[0] < w[1]),
                "in order: {starts:?}"
            );
            // Depth 10, then 32.5, 55, 77.5 percent: the gaps are about equal.
            let gaps: Vec<f64> = starts.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
            for g in &gaps {
                assert!(
                    (g / gaps[0] - 1.0).abs() < 0.2,
                    "{name}: even gaps {gaps:?}"
                );
            }
            assert!(
                (p.actual_depth_pct - 10.0).abs() <= 1.0,
                "{}",
                p.actual_depth_pct
            );
            for n in &p.needles {
                let decoded = t.decode(&p.tokens[n.span.0..n.span.1]).unwrap();
                assert_eq!(decoded.trim(), n.text, "{name}: span of {:?}", n.text);
                assert_eq!(p.prompt_text.matches(n.text.as_str()).count(), 1);
            }
            let texts: std::collections::BTreeSet<&str> =
                p.needles.iter().map(|n| n.text.as_str()).collect();
            assert_eq!(texts.len(), 4, "distinct needles");
            let asked: Vec<usize> = match ask {
                Ask::First => vec![0],
                Ask::Last => vec![3],
                Ask::All => vec![0, 1, 2, 3],
            };
            assert_eq!(p.answer_values.len(), asked.len());
            for (v, &i) in p.answer_values.iter().zip(&asked) {
                assert!(p.needles[i].text.contains(v.as_str()), "{v} in needle {i}");
            }
            let answer = t.decode(&p.tokens[p.answer.0..p.answer.1]).unwrap();
            assert_eq!(answer.trim(), p.answer_values[0]);
            let question = &p.question;
            match (name, ask) {
                ("passkey", Ask::First) => assert!(question.contains("first pass key")),
                ("passkey", Ask::Last) => assert!(question.contains("last pass key")),
                ("passkey", Ask::All) => assert!(question.contains("all the pass keys")),
                (_, Ask::All) => {
                    assert!(
                        p.needles.iter().all(|n| {
                            let key = n.text.split_whitespace().nth(4).unwrap();
                            question.contains(key)
                        }),
                        "{question}"
                    );
                }
                (_, _) => {
                    let key = p.needles[asked[0]].text.split_whitespace().nth(4).unwrap();
                    assert!(question.contains(key), "{question} asks {key}");
                }
            }
            // The judge wants every asked value, and no other number of their length.
            let all = p.answer_values.join(", ");
            assert_eq!(sc.judge_generated(&all, &p.answer_values, true), Some(true));
            if ask == Ask::All {
                let three = p.answer_values[..3].join(", ");
                assert_eq!(
                    sc.judge_generated(&three, &p.answer_values, true),
                    Some(false)
                );
            } else {
                let other = p
                    .needles
                    .iter()
                    .position(|n| !n.text.contains(p.answer_values[0].as_str()))
                    .unwrap();
                let wrong_value: String = p.needles[other]
                    .text
                    .chars()
                    .filter(|c| c.is_ascii_digit())
                    .collect();
                let hedge = format!("{} or {wrong_value}", p.answer_values[0]);
                assert_eq!(
                    sc.judge_generated(&hedge, &p.answer_values, true),
                    Some(false)
                );
            }
        }
        // One needle draws exactly as before.
        let one = build_prompt_with(&t, &sc, 2048, 50.0, 3, MAX, NeedleCount::default()).unwrap();
        assert_eq!(one, build_prompt(&t, &sc, 2048, 50.0, 3, MAX).unwrap());
    }
    let essay = scenario("essay", &dir);
    let plan = NeedleCount {
        count: 2,
        ask: Ask::First,
    };
    let err = build_prompt_with(&t, &essay, 2048, 50.0, 0, MAX, plan).unwrap_err();
    assert!(matches!(err, PromptError::NeedleCount { .. }), "{err}");
    assert!(err.to_string().contains("needles.ask_first"), "{err}");
}
