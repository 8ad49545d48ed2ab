//! Tests of `haystack.rs`: generated sentences, file units and where long runs are cut.

use super::*;

#[test]
fn noise_sentences_vary_and_carry_no_digits() {
    let mut rng = Rng::new(3);
    let s: Vec<String> = (0..200).map(|_| noise_sentence(&mut rng)).collect();
    let distinct: std::collections::HashSet<&String> = s.iter().collect();
    assert!(
        distinct.len() > 190,
        "only {} distinct sentences",
        distinct.len()
    );
    assert!(s.iter().all(|x| !x.chars().any(|c| c.is_ascii_digit())));
    assert!(s.iter().all(|x| x.ends_with('.') && !x.contains('{')));
}

#[test]
fn file_units_reassemble_the_text() {
    let text = "First one. Second, longer sentence!\n\nNew paragraph here? Tail";
    let units = file_units(text, Path::new("t.txt")).unwrap();
    let mut joined = String::new();
    for u in &units {
        joined.push_str(&u.sep);
        joined.push_str(&u.text);
    }
    assert_eq!(joined, text);
    assert_eq!(units.len(), 4);
}

/// Text without spaces (here Chinese) is cut after each full-width full stop and within
/// long runs, and still reassembles to the file's text; a BOM and CR line ends are dropped.
#[test]
fn spaceless_text_is_cut_into_small_units() {
    let sentence = "河流是最早的道路。它们运送粮食和石头，也传递消息。";
    let text = format!("\u{feff}{}\r\n{}", sentence.repeat(20), "x".repeat(1000));
    let units = file_units(&text, Path::new("zh.txt")).unwrap();
    let joined: String = units
        .iter()
        .map(|u| format!("{}{}", u.sep, u.text))
        .collect();
    assert_eq!(
        joined,
        format!("{}\n{}", sentence.repeat(20), "x".repeat(1000))
    );
    assert!(units.len() >= 40 + 1000 / RUN_CHARS, "{}", units.len());
    assert!(units.iter().all(|u| u.text.chars().count() <= RUN_CHARS));
    assert!(units[0].text.ends_with('。') && units[1].sep.is_empty());
}

/// Long runs are cut between grapheme clusters only: never before a Thai tone mark or
/// vowel sign, inside an emoji joiner sequence, or between a flag's two letters (the
/// needle goes between units, so such a cut would break a word or a symbol in two).
#[test]
fn spaceless_runs_are_cut_between_whole_characters() {
    let thai = "ข่าวที่น่าสนใจ".repeat(40);
    let family = "👩\u{200d}👩\u{200d}👧".repeat(400);
    let flags = "🇯🇵🇫🇷".repeat(200);
    let accents = "e\u{301}".repeat(400);
    for text in [&thai, &family, &flags, &accents] {
        let units = file_units(text, Path::new("t.txt")).unwrap();
        assert!(units.len() > 1, "the run was not cut at all");
        let joined: String = units.iter().map(|u| u.text.as_str()).collect();
        assert_eq!(&joined, text);
        for u in &units {
            let first = u.text.chars().next().unwrap();
            let last = u.text.chars().last().unwrap();
            let combining = matches!(first, '\u{0e31}' | '\u{0e34}'..='\u{0e3a}' | '\u{0e47}'..='\u{0e4e}' | '\u{301}');
            assert!(!combining, "a unit starts with the mark {first:?}");
            assert!(first != '\u{200d}' && last != '\u{200d}', "cut at a joiner");
            let indicators = u
                .text
                .chars()
                .filter(|c| ('\u{1f1e6}'..='\u{1f1ff}').contains(c))
                .count();
            assert!(indicators % 2 == 0, "a flag cut in two: {:?}", u.text);
        }
    }
}
