//! The V4 chat encoder against golden renderings made by the reference encoder
//! (tests/reference/make_chat_goldens.py; revision and command in tests/reference/README.md):
//! each conversation in tests/reference/chat/ renders byte for byte as the reference renders
//! it, and encodes id for id as Hugging Face `tokenizers` encodes that text.

use needlescope::probe::chat::ChatRequest;
use needlescope::tokenizer::V4Tokenizer;
use std::path::PathBuf;

fn cases() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/chat");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.ends_with(".json") && !name.ends_with(".ids.json")
        })
        .collect();
    cases.sort();
    cases
}

/// Panics at the first differing byte of a rendering, showing both sides around it.
fn assert_same_text(got: &str, want: &str, what: &str) {
    if got == want {
        return;
    }
    let at = got
        .bytes()
        .zip(want.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    let around = |t: &str| {
        let (a, b) = (at.saturating_sub(40).min(t.len()), (at + 80).min(t.len()));
        // Widen to char boundaries.
        let a = (0..=a).rev().find(|&i| t.is_char_boundary(i)).unwrap_or(0);
        let b = (b..=t.len())
            .find(|&i| t.is_char_boundary(i))
            .unwrap_or(t.len());
        t[a..b].to_string()
    };
    panic!(
        "{what}: rendering differs from byte {at}:\n got: {:?}\nwant: {:?}",
        around(got),
        around(want)
    );
}

#[test]
fn every_golden_conversation_renders_byte_for_byte_and_id_for_id() {
    let tok = V4Tokenizer::builtin().unwrap();
    let cases = cases();
    assert!(cases.len() >= 12, "{} golden conversations", cases.len());
    for case in cases {
        let stem = case.to_string_lossy().trim_end_matches(".json").to_string();
        let want_text = std::fs::read_to_string(format!("{stem}.rendered.txt")).unwrap();
        let want_ids: Vec<u32> =
            serde_json::from_str(&std::fs::read_to_string(format!("{stem}.ids.json")).unwrap())
                .unwrap();
        let request = ChatRequest::from_file(&case).unwrap_or_else(|e| panic!("{e}"));
        let got = request.render().text;
        assert_same_text(&got, &want_text, &case.display().to_string());
        let ids = tok.encode(&got).unwrap();
        assert_eq!(ids, want_ids, "{}: token ids", case.display());
    }
}

/// The V4.1 encoder against SGLang's V4.1 port (tests/reference/make_chat_goldens_v41.py;
/// tests/reference/chat_v41/README.md): the V4 conversations and the V4.1-only ones render
/// byte for byte, encode id for id under the bundled tokenizer, and the one SGLang refuses is
/// refused.
#[test]
fn every_v41_golden_conversation_renders_byte_for_byte_and_id_for_id() {
    use needlescope::probe::chat::ChatFormat;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference");
    let golden = root.join("chat_v41");
    let mut cases = cases();
    cases.extend(
        std::fs::read_dir(&golden)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.ends_with(".json") && !name.ends_with(".ids.json")
            }),
    );
    cases.sort_by_key(|p| p.file_name().unwrap().to_owned());
    assert!(cases.len() >= 20, "{} conversations", cases.len());
    let tok = V4Tokenizer::builtin().unwrap();
    let (mut rendered, mut refused) = (0, 0);
    for case in cases {
        let stem = case
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".json")
            .to_string();
        let got = ChatRequest::from_file_as(&case, ChatFormat::V41);
        let error = golden.join(format!("{stem}.error.txt"));
        if error.exists() {
            let e = got
                .expect_err(&format!("{stem}: SGLang refuses it"))
                .to_string();
            assert!(e.contains("arguments"), "{stem}: {e}");
            refused += 1;
            continue;
        }
        let request = got.unwrap_or_else(|e| panic!("{stem}: {e}"));
        let want_text =
            std::fs::read_to_string(golden.join(format!("{stem}.rendered.txt"))).unwrap();
        let want_ids: Vec<u32> = serde_json::from_str(
            &std::fs::read_to_string(golden.join(format!("{stem}.ids.json"))).unwrap(),
        )
        .unwrap();
        let got = request.render().text;
        assert_same_text(&got, &want_text, &stem);
        assert_eq!(tok.encode(&got).unwrap(), want_ids, "{stem}: token ids");
        rendered += 1;
    }
    assert_eq!((rendered, refused), (19, 1));
}
