//! Scenario files: built-ins load, user files resolve, and every invalid field is an error that
//! names the file and the field with expected vs found.

use needlescope::probe::scenario::{AnswerCheck, HaystackKind, Scenario, ValueSpec};

fn parse(text: &str) -> Result<Scenario, String> {
    Scenario::from_toml_str(text, "my.toml", None).map_err(|e| e.to_string())
}

const BASE: &str = r#"
name = "t"
needle = "The code is {value}."
question = "What is the code?"
[value]
kind = "digits"
n = 5
[haystack]
kind = "noise"
"#;

#[test]
fn builtin_scenarios_load_with_their_documented_shapes() {
    assert_eq!(
        Scenario::builtin_names(),
        vec!["passkey", "kv-retrieval", "code-cwd", "essay"]
    );
    let p = Scenario::load("passkey").unwrap();
    assert_eq!(p.haystack, HaystackKind::Noise);
    assert_eq!(p.value, ValueSpec::Digits { n: 7 });
    assert_eq!(p.source, "builtin:passkey");
    let kv = Scenario::load("kv-retrieval").unwrap();
    assert_eq!(kv.haystack, HaystackKind::Kv);
    assert!(kv.needle.contains("{key}") && kv.question.contains("{key}"));
    let cwd = Scenario::load("code-cwd").unwrap();
    assert_eq!(cwd.haystack, HaystackKind::Tools);
    assert!(cwd
        .needle
        .starts_with("The current working directory is /srv/build/{value}"));
    assert_eq!(
        Scenario::load("essay").unwrap().haystack,
        HaystackKind::File(None)
    );
}

#[test]
fn unknown_names_list_the_builtins() {
    let msg = Scenario::load("no-such-scenario").unwrap_err().to_string();
    assert!(
        msg.contains("no-such-scenario") && msg.contains("passkey, kv-retrieval"),
        "{msg}"
    );
}

#[test]
fn a_user_file_loads_and_its_haystack_path_resolves_next_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mine.toml");
    let text = BASE.replace("kind = \"noise\"", "kind = \"file\"\nfile = \"text.txt\"");
    std::fs::write(&path, text).unwrap();
    let sc = Scenario::load(path.to_str().unwrap()).unwrap();
    assert_eq!(
        sc.haystack,
        HaystackKind::File(Some(dir.path().join("text.txt")))
    );
    assert_eq!(sc.source, path.display().to_string());
}

#[test]
fn invalid_fields_name_the_file_field_expected_and_found() {
    let cases: Vec<(String, &str)> = vec![
        (
            BASE.replace("{value}.", "."),
            "`needle`: expected exactly one {value} slot, found 0",
        ),
        (
            BASE.replace("{value}.", "{value} {value}."),
            "`needle`: expected exactly one {value} slot, found 2",
        ),
        (
            BASE.replace("{value}.", "{value} {colour}."),
            "only the slots {value} and {key}, found {colour}",
        ),
        (
            BASE.replace("What is the code?", "Is it {value}?"),
            "`question`: expected no {value} slot",
        ),
        (
            BASE.replace("kind = \"digits\"", "kind = \"letters\""),
            "`value.kind`: expected \"digits\", \"words\" or \"uuid\", found \"letters\"",
        ),
        (
            BASE.replace("n = 5", "n = 0"),
            "`value.n`: expected an integer in 1..=64, found 0",
        ),
        (
            BASE.replace("kind = \"noise\"", "kind = \"web\""),
            "`haystack.kind`",
        ),
        (
            BASE.replace("kind = \"noise\"", "kind = \"kv\""),
            "{key} in both needle and question",
        ),
        (
            BASE.replace("{value}.", "{value} for {key}."),
            "`key`: expected a [key] table",
        ),
        (
            format!("{BASE}[answer]\ncheck = \"regex\"\npattern = \"({{value}}\"\n"),
            "`answer.pattern`: expected a valid regex",
        ),
        (
            format!("{BASE}[answer]\ncheck = \"regex\"\n"),
            "`answer.pattern`: expected a pattern",
        ),
        (
            format!("{BASE}[answer]\ncheck = \"exact\"\n"),
            "`answer.check`",
        ),
        (
            BASE.replace("What is the code?", "<｜User｜>What?"),
            "`question`: expected plain text without chat markers",
        ),
        (format!("{BASE}colour = \"red\"\n"), "invalid TOML"),
        (
            BASE.replace(
                "kind = \"digits\"\nn = 5",
                "kind = \"words\"\nn = 2\nwords = []",
            ),
            "`value.words`",
        ),
        (
            format!("{BASE}[answer]\ncheck = \"regex\"\npattern = \".\"\n"),
            "`answer.pattern`: expected a pattern containing {value}, found \".\"",
        ),
        (
            BASE.replace("name = \"t\"", "name = \"a\\nb\""),
            "`name`: expected a name without control characters",
        ),
        (
            BASE.replace(
                "kind = \"digits\"\nn = 5",
                "kind = \"words\"\nn = 2\nwords = [\"<｜User｜>\", \"apple\"]",
            ),
            "`value.words`: expected plain words without chat markers or special-token text, found \"<｜User｜>\"",
        ),
        (
            BASE.replace(
                "kind = \"digits\"\nn = 5",
                "kind = \"words\"\nn = 2\nsep = \"<｜end▁of▁sentence｜>\"",
            ),
            "`value.sep`: expected a separator without chat markers",
        ),
        (
            BASE.replace(
                "kind = \"digits\"\nn = 5",
                "kind = \"words\"\nn = 2\nwords = [\"apple\", \"x{value}\"]",
            ),
            "`value.words`: expected words without braces, found \"x{value}\"",
        ),
    ];
    for (text, expected) in cases {
        let msg = parse(&text).unwrap_err();
        assert!(msg.starts_with("scenario my.toml"), "{msg}");
        assert!(msg.contains(expected), "expected {expected:?} in {msg:?}");
    }
}

#[test]
fn haystack_file_only_applies_to_file_scenarios() {
    let msg = Scenario::load("passkey")
        .unwrap()
        .with_haystack_file(std::path::Path::new("x.txt"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("--haystack-file") && msg.contains("`noise`"),
        "{msg}"
    );
}

#[test]
fn answer_checks_use_the_expected_value() {
    let sc = parse(BASE).unwrap();
    assert_eq!(sc.answer, AnswerCheck::Substring);
    assert!(sc.check_answer("The code is 12345.", "12345"));
    assert!(!sc.check_answer("The code is 1234.", "12345"));
    // Every built-in scenario's value is digits: a longer number containing them is wrong.
    for name in ["kv-retrieval", "passkey", "code-cwd", "essay"] {
        let sc = Scenario::load(name).unwrap();
        assert!(sc.check_answer("1234567", "1234567"), "{name}");
        assert!(
            sc.check_answer("It is /srv/build/1234567.", "1234567"),
            "{name}"
        );
        for wrong in [
            "91234567",
            "12345678",
            "It is 1234567890.",
            // A hedge between two candidates is not a recall.
            "1234567 or 7654321",
            "Either 7654321 or 1234567.",
        ] {
            assert!(
                !sc.check_answer(wrong, "1234567"),
                "{name}: {wrong:?} is not the value 1234567"
            );
        }
    }
    let re = parse(&format!(
        "{BASE}[answer]\ncheck = \"regex\"\npattern = \"^\\\\s*{{value}}\\\\b\"\n"
    ))
    .unwrap();
    assert!(re.check_answer(" 42.", "42") && !re.check_answer("x 42", "42"));
    assert!(re.check_answer("a+b", "a+b"), "the value is regex-escaped");
}

#[test]
fn generated_values_are_seeded_and_well_formed() {
    let digits = parse(BASE).unwrap();
    let (v, k) = digits.generate_value(7);
    assert_eq!((v.len(), k.as_str()), (5, ""));
    assert!(!v.starts_with('0') && v.chars().all(|c| c.is_ascii_digit()));
    assert_eq!(digits.generate_value(7), (v, k));

    let uuid = parse(&BASE.replace("kind = \"digits\"\nn = 5", "kind = \"uuid\"")).unwrap();
    let (u, _) = uuid.generate_value(1);
    let parts: Vec<usize> = u.split('-').map(str::len).collect();
    assert_eq!(parts, vec![8, 4, 4, 4, 12], "{u}");
    assert!(u.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));

    let kv = Scenario::load("kv-retrieval").unwrap();
    let (value, key) = kv.generate_value(3);
    assert_eq!(value.len(), 8);
    assert_eq!(key.split('-').count(), 3, "{key}");
}

/// A `--scenario` that is neither a built-in nor a file says which: missing, or a directory.
#[test]
fn unknown_scenario_says_missing_or_directory() {
    let dir = tempfile::tempdir().unwrap();
    let e = Scenario::load(dir.path().to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("a directory, expected a TOML file"), "{e}");
    let e = Scenario::load(dir.path().join("none.toml").to_str().unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("no such file") && e.contains("passkey"), "{e}");
}

/// In thinking mode the answer is the text after the last `</think>` (as the tokenizer decodes
/// it): a value repeated while reasoning is no answer, and no `</think>` means no answer yet.
#[test]
fn thinking_mode_judges_only_the_text_after_the_reasoning() {
    let tok = needlescope::tokenizer::V4Tokenizer::builtin().unwrap();
    let end = tok.decode(&[128_822]).unwrap();
    assert_eq!(
        end, "</think>",
        "the decoded text keeps the end of thinking"
    );
    let chat = parse(BASE).unwrap();
    let thinking = parse(&BASE.replace("name = \"t\"", "name = \"t\"\nthinking = true")).unwrap();
    assert!(thinking.thinking);
    // A thinking scenario judged by its answer says that the answer follows </think>.
    let note = thinking.thinking_note(24).unwrap();
    assert!(
        note.contains("its answer follows </think>") && note.contains("24 generated tokens"),
        "{note}"
    );
    assert!(thinking.thinking_note(0).is_none() && chat.thinking_note(24).is_none());
    let reasoning_only = "The code mentioned was 12345, so";
    let answered = format!("The code mentioned was 12345.{end}12345");
    let wrong_answer = format!("The code mentioned was 12345.{end}I do not know.");
    assert_eq!(
        chat.judge_generated(reasoning_only, &["12345".to_string()], false),
        Some(true)
    );
    // Reasoning cut off before </think>: no answer, so no verdict (not WRONG), even when the
    // model stopped there itself.
    for ended in [false, true] {
        assert_eq!(
            thinking.judge_generated(reasoning_only, &["12345".to_string()], ended),
            None
        );
        assert_eq!(
            thinking.judge_generated(&answered, &["12345".to_string()], ended),
            Some(true)
        );
    }
    assert_eq!(
        thinking.judge_generated(&wrong_answer, &["12345".to_string()], true),
        Some(false)
    );
    // Cut off by the token limit right after </think>, or inside the value: no verdict.
    let cut_after_think = format!("The code mentioned was 12345.{end}");
    assert_eq!(
        thinking.judge_generated(&cut_after_think, &["12345".to_string()], false),
        None
    );
    assert_eq!(
        chat.judge_generated("The code is 123", &["12345".to_string()], false),
        None
    );
    assert_eq!(
        chat.judge_generated("The code is 123", &["12345".to_string()], true),
        Some(false)
    );
}

/// A haystack file must be a regular text file: a device (read until memory runs out) and
/// text with NUL bytes (UTF-16 without a byte-order mark, a binary) are refused, naming it.
#[test]
fn haystack_files_that_are_not_text_files_are_refused() {
    use needlescope::probe::haystack::read_file_units;
    let dir = tempfile::tempdir().unwrap();
    let e = read_file_units(std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("/dev/zero") && e.contains("not a regular file"),
        "{e}"
    );
    let e = read_file_units(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    let e = read_file_units(&dir.path().join("missing.txt"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("missing.txt") && e.contains("no such file"),
        "{e}"
    );
    let utf16 = dir.path().join("utf16.txt");
    let bytes: Vec<u8> = "Hello there."
        .encode_utf16()
        .flat_map(|u| u.to_le_bytes())
        .collect();
    std::fs::write(&utf16, bytes).unwrap();
    let e = read_file_units(&utf16).unwrap_err().to_string();
    assert!(
        e.contains("utf16.txt") && e.contains("a NUL byte at offset 1"),
        "{e}"
    );
    let ok = dir.path().join("ok.txt");
    std::fs::write(&ok, "One sentence. Another one.").unwrap();
    assert!(!read_file_units(&ok).unwrap().is_empty());
}

/// The `[needles]` table: its questions are read, and a slot it cannot fill is refused by name.
#[test]
fn the_needles_table_is_read_and_checked() {
    let base = "name = \"m\"\nneedle = \"The code is {value}.\"\nquestion = \"Code?\"\n[value]\nkind = \"digits\"\nn = 5\n[haystack]\nkind = \"noise\"\n";
    let ok = Scenario::from_toml_str(
        &format!("{base}[needles]\nask_first = \"First code?\"\nask_all = \"All codes?\"\n"),
        "m.toml",
        None,
    )
    .unwrap();
    assert_eq!(ok.ask.first.as_deref(), Some("First code?"));
    assert_eq!(ok.ask.last, None);
    assert_eq!(ok.ask.all.as_deref(), Some("All codes?"));
    for (table, field) in [
        ("ask_all = \"Values of {keys}?\"", "needles.ask_all"),
        ("ask_first = \"Value {value}?\"", "needles.ask_first"),
        ("ask_last = \"\"", "needles.ask_last"),
        ("ask_first = \"<｜User｜>\"", "needles.ask_first"),
        ("ask_other = \"x\"", "ask_other"),
    ] {
        let err = Scenario::from_toml_str(&format!("{base}[needles]\n{table}\n"), "m.toml", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{table}: {err}");
    }
    // kv-retrieval asks first / last with its question, `all` from its table.
    let kv = Scenario::load("kv-retrieval").unwrap();
    assert_eq!(kv.ask.first.as_deref(), Some(kv.question.as_str()));
    assert!(kv.ask.all.as_deref().unwrap().contains("{keys}"));
}

/// A missing field is named (not "invalid TOML at line 1, column 1", the comment line), with
/// the table it belongs to; a name close to a built-in's is suggested (issue 30).
#[test]
fn a_missing_field_is_named_and_a_misspelt_builtin_is_suggested() {
    let no_question = "# My scenario.\nname = \"m\"\nneedle = \"The code is {value}.\"\n[value]\nkind = \"digits\"\nn = 5\n[haystack]\nkind = \"noise\"\n";
    let err = Scenario::from_toml_str(no_question, "m.toml", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("m.toml") && err.contains("missing field `question`"),
        "{err}"
    );
    assert!(!err.contains("column 1"), "{err}");
    let no_kind = "name = \"m\"\nneedle = \"The code is {value}.\"\nquestion = \"Code?\"\n[value]\nn = 5\n[haystack]\nkind = \"noise\"\n";
    let err = Scenario::from_toml_str(no_kind, "m.toml", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing field `kind` in the table that starts at line 4"),
        "{err}"
    );
    let err = Scenario::load("passkee").unwrap_err().to_string();
    assert!(err.ends_with("did you mean passkey?"), "{err}");
    let err = Scenario::load("kv-retrival").unwrap_err().to_string();
    assert!(err.ends_with("did you mean kv-retrieval?"), "{err}");
    let err = Scenario::load("zzz").unwrap_err().to_string();
    assert!(!err.contains("did you mean"), "{err}");
}
