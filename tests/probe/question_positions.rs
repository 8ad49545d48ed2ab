//! `--probe question`: the probed positions are exactly the question's tokens in the prompt ids
//! (the prompt text re-encodes to the same ids, BOS included).

use needlescope::probe::prompt::build_prompt;
use needlescope::probe::scenario::Scenario;
use needlescope::probe::session::question_positions;
use needlescope::tokenizer::V4Tokenizer;

#[test]
fn question_positions_are_the_question_tokens() {
    let tok = V4Tokenizer::builtin().unwrap();
    for name in ["passkey", "kv-retrieval", "code-cwd"] {
        let scenario = Scenario::load(name).unwrap();
        for (len, depth, seed) in [(300usize, 50.0, 1u64), (2000, 0.0, 2), (1000, 100.0, 3)] {
            let prompt = build_prompt(&tok, &scenario, len, depth, seed, 1 << 20).unwrap();
            let (ids, _) = tok.encode_with_offsets(&prompt.prompt_text).unwrap();
            assert_eq!(ids, prompt.tokens, "{name} {len}: re-encoded ids differ");
            let pos = question_positions(&tok, &prompt);
            assert!(!pos.is_empty());
            let ids: Vec<u32> = pos.iter().map(|&p| prompt.tokens[p]).collect();
            let text = tok.decode(&ids).unwrap();
            assert!(
                text.contains(prompt.question.trim()),
                "{name}: {text:?} vs {:?}",
                prompt.question
            );
            assert!(pos.windows(2).all(|w| w[1] == w[0] + 1));
            println!("{name} {len}: {pos:?} {text:?}");
        }
    }
}
