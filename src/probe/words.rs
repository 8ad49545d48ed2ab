//! Word lists and sentence templates for the generated haystacks and word-valued needles.
//!
//! All text here is our own. It contains no digits on purpose: a numeric needle value is then
//! the only number in a `noise` haystack, so the model's answer cannot come from the haystack.
//! Sentence templates use slots that `haystack.rs` fills: `{np}` / `{np2}` noun phrases with an
//! article, `{name}`, `{place}`, `{time}`, `{adv}`, `{adj}`, `{noun}`, `{nouns}`, `{vi}`
//! (intransitive past), `{vt}` (transitive past), `{unit}` (a span of time), `{thing}` (an
//! abstract noun). 40 templates x these lists give far more distinct sentences than any prompt
//! needs, so no haystack is one sentence repeated.

#[rustfmt::skip]
pub const ADJECTIVES: &[&str] = &[
    "quiet", "narrow", "copper", "weathered", "patient", "crooked", "silver", "hollow", "amber",
    "restless", "faded", "gentle", "distant", "heavy", "brittle", "crimson", "muddy", "polished",
    "ancient", "careful", "stubborn", "bright", "dusty", "frozen", "golden", "humble", "lonely",
    "modest", "noisy", "pale", "rusty", "sleepy", "tall", "tidy", "velvet", "wild", "wooden",
    "woollen", "curious", "stony",
];

#[rustfmt::skip]
pub const NOUNS: &[&str] = &[
    "lantern", "ferry", "orchard", "bridge", "library", "kettle", "harbour", "meadow", "chapel",
    "market", "lighthouse", "windmill", "garden", "workshop", "cellar", "balcony", "courtyard",
    "barn", "quarry", "tavern", "fountain", "greenhouse", "mill", "pier", "stable", "tower",
    "vineyard", "wagon", "cabin", "canal", "clock", "compass", "drum", "fence", "ladder", "map",
    "notebook", "piano", "quilt", "satchel",
];

#[rustfmt::skip]
pub const PLURALS: &[&str] = &[
    "lanterns", "ferries", "orchards", "bridges", "kettles", "meadows", "markets", "windmills",
    "gardens", "workshops", "barns", "fountains", "wagons", "cabins", "canals", "clocks", "maps",
    "notebooks", "quilts", "sparrows", "herons", "foxes", "pebbles", "candles", "letters",
    "ribbons", "shutters", "sails", "bells", "baskets",
];

#[rustfmt::skip]
pub const NAMES: &[&str] = &[
    "Agnes", "Bruno", "Celia", "Dmitri", "Elena", "Farid", "Greta", "Hugo", "Ingrid", "Jonas",
    "Kaveh", "Lucia", "Marek", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Stefan", "Tamsin",
    "Ulla", "Viktor", "Wanda", "Yusuf", "Zofia", "the ferryman", "the old baker",
    "the schoolteacher", "the night watchman", "the cartographer",
];

#[rustfmt::skip]
pub const PLACES: &[&str] = &[
    "the valley", "the old quarter", "the river town", "the hill village", "the coastal road",
    "the northern farms", "the market square", "the mountain pass", "the salt marsh", "the island",
    "the forest edge", "the harbour district", "the upper town", "the monastery",
    "the border station", "the dry plains", "the lake shore", "the abandoned mine",
    "the railway junction", "the botanical garden",
];

#[rustfmt::skip]
pub const TIMES: &[&str] = &[
    "at dawn", "before the storm", "after the harvest", "during the long winter", "on market days",
    "late in the evening", "in early spring", "every other morning", "when the tide turned",
    "long before the railway came", "after midnight", "in the dry season", "at the end of autumn",
    "during the festival", "on foggy afternoons", "before anyone else woke",
    "in the weeks after the flood", "at the turn of the season",
];

#[rustfmt::skip]
pub const ADVERBS: &[&str] = &[
    "slowly", "quietly", "carefully", "suddenly", "patiently", "stubbornly", "gracefully",
    "reluctantly", "cheerfully", "silently", "steadily", "briefly", "loudly", "gently",
    "awkwardly", "eagerly", "calmly", "endlessly", "nervously", "proudly",
];

#[rustfmt::skip]
pub const VERBS_INTRANSITIVE: &[&str] = &[
    "drifted", "waited", "creaked", "rested", "wandered", "glowed", "faded", "lingered", "settled",
    "trembled", "vanished", "returned", "flickered", "rattled", "leaned", "swayed", "collapsed",
    "echoed", "thawed", "rusted",
];

#[rustfmt::skip]
pub const VERBS_TRANSITIVE: &[&str] = &[
    "repaired", "painted", "measured", "carried", "polished", "guarded", "described", "borrowed",
    "mended", "sketched", "counted", "rebuilt", "moved", "inspected", "sold", "traded",
    "photographed", "cleaned", "forgot", "admired",
];

#[rustfmt::skip]
pub const TIME_UNITS: &[&str] = &[
    "morning", "week", "season", "winter", "summer", "month", "evening", "year", "spring",
    "harvest",
];

#[rustfmt::skip]
pub const ABSTRACT: &[&str] = &[
    "patience", "silence", "habit", "memory", "weather", "tradition", "rumour", "routine",
    "distance", "luck", "craft", "custom", "gossip", "order", "neglect",
];

/// Sentence templates for the `noise` haystack (filled by `haystack::noise_sentence`).
#[rustfmt::skip]
pub const TEMPLATES: &[&str] = &[
    "{time}, {np} {vi} {adv} near {place}.",
    "{name} {vt} {np} and then walked back to {place}.",
    "Nobody in {place} could say why {np} {vi} so {adv}.",
    "The {adj} {noun} by the road {vi} {time}.",
    "{name} kept {np} on a shelf beside {np2}.",
    "According to {name}, {np} {vi} every {unit}.",
    "In {place}, {nouns} were common, and {np} {vi} {adv}.",
    "{name} once {vt} {np} for a stranger from {place}.",
    "It was said that {thing} mattered more than {thing2} in {place}.",
    "{time}, {name} {vt} {np} while {np2} {vi} nearby.",
    "The {nouns} of {place} {vi} {adv} {time}.",
    "Few people noticed that {np} had {vi} again.",
    "{name} preferred {adj} {nouns} to {adj2} ones.",
    "There was {np} behind {np2}, and nobody {vt} it.",
    "Travellers from {place} often {vt} {np} {time}.",
    "Each {unit}, {name} {vt} {np} with great {thing}.",
    "The story of {np} was told {adv} in {place}.",
    "By the end of the {unit}, {np} had {vi} completely.",
    "{name} and {name2} {vt} {np} together {time}.",
    "Out past {place}, {np} {vi} beside {np2}.",
    "The {adj} {nouns} in {place} {vi} {time}.",
    "{name} wrote about {np} in a {adj} notebook.",
    "Everyone agreed that {np} looked {adj} {time}.",
    "A {adj} wind {vi} across {place} {time}.",
    "{name} said that {thing} was the secret of {place}.",
    "When {np} {vi}, {name} {vt} {np2} instead.",
    "The children of {place} {vt} {np} {adv}.",
    "Somewhere in {place}, {np} still {vi} {adv}.",
    "{name} never {vt} {np}, out of {thing}.",
    "Under {np}, someone had hidden {adj} {nouns}.",
    "The {noun} and the {noun2} both {vi} {time}.",
    "{name} {vt} {np} {adv}, as was the {thing} in {place}.",
    "Most {nouns} in {place} were {adj} and {adj2}.",
    "The road to {place} {vi} {adv} {time}.",
    "Long ago, {name} {vt} {np} near {place}.",
    "{np} was {adj}, but {np2} was even more {adj2}.",
    "Whenever {name} {vt} {np}, {np2} {vi}.",
    "Visitors rarely {vt} the {adj} {nouns} of {place}.",
    "The {thing} of {place} {vi} {adv} over the {unit}.",
    "{name} watched {np} as it {vi} {adv}.",
];

/// Tool-definition building blocks for the `tools` haystack (agentic prompts).
#[rustfmt::skip]
pub const TOOL_VERBS: &[&str] = &[
    "get", "list", "create", "update", "delete", "search", "sync", "export", "archive", "render",
    "validate", "schedule", "fetch", "resolve", "merge", "publish", "restore", "rotate", "tag",
    "summarize",
];

#[rustfmt::skip]
pub const TOOL_OBJECTS: &[&str] = &[
    "invoice", "user_profile", "build_artifact", "calendar_event", "shipment", "support_ticket",
    "repository", "pull_request", "dns_record", "secret", "deployment", "dataset", "notebook_cell",
    "inventory_item", "payment", "webhook", "feature_flag", "log_stream", "container_image",
    "translation", "email_draft", "spreadsheet_range", "map_tile", "weather_report",
    "sensor_reading",
];

#[rustfmt::skip]
pub const PARAM_NAMES: &[&str] = &[
    "account_id", "query", "limit", "cursor", "include_archived", "sort_order", "fields", "region",
    "owner", "labels", "dry_run", "timeout_seconds", "format", "locale", "path", "branch",
    "environment", "priority", "due_date", "recipient", "channel", "retry_policy", "callback_url",
    "filter", "page_size", "namespace", "revision", "tags", "notes", "mode",
];

pub const PARAM_TYPES: &[&str] = &["string", "integer", "boolean", "array", "object", "string"];

#[rustfmt::skip]
pub const PARAM_PURPOSES: &[&str] = &[
    "Restricts the result to entries owned by this account",
    "Free text matched against names and descriptions",
    "Maximum number of entries returned in one page",
    "Opaque cursor returned by the previous call",
    "Whether archived entries are included",
    "Order of the returned entries",
    "Subset of fields to include in each entry",
    "Region whose data centre serves the request",
    "Only entries created by this owner are considered",
    "Labels that every returned entry must carry",
    "Validate the request without applying any change",
    "Give up after this many seconds",
    "Output format of the exported document",
    "Language and regional conventions for the text",
    "Location of the file relative to the project root",
    "Branch that the operation applies to",
    "Target environment such as staging or production",
    "Urgency used when several requests compete",
    "Deadline in the caller's local calendar",
    "Person or team that receives the notification",
    "Messaging channel where the update is posted",
    "How failed attempts are retried",
    "Address called when the job finishes",
    "Structured filter expression",
    "Preferred number of entries per page",
    "Logical namespace that isolates resources",
    "Specific revision to read instead of the latest",
    "Additional tags attached to the new entry",
    "Free-form notes stored with the entry",
    "Processing mode chosen by the caller",
];

#[rustfmt::skip]
pub const TOOL_PURPOSES: &[&str] = &[
    "Returns the matching entries as a paginated list, newest first.",
    "Applies the change atomically and returns the updated entry.",
    "Fails with a conflict error when another client changed the entry in the meantime.",
    "Requires write access to the workspace; read-only tokens are rejected.",
    "Large results are streamed; the caller should follow the cursor until it is empty.",
    "The operation is idempotent when the same request key is reused.",
    "Entries in the trash are ignored unless explicitly requested.",
    "Use this before any destructive action to show the user what will change.",
    "The response includes a short human-readable summary for display.",
    "Rate limited per account; back off when the service asks to.",
    "Never call this tool for entries the user has not mentioned.",
    "Returns an empty list rather than an error when nothing matches.",
];

#[rustfmt::skip]
pub const ENUM_VALUES: &[&str] = &[
    "ascending", "descending", "draft", "final", "fast", "thorough", "json", "csv", "markdown",
    "staging", "production", "low", "normal", "high", "hourly", "daily",
];

#[rustfmt::skip]
pub const PATH_PARTS: &[&str] = &[
    "srv", "var", "opt", "home", "workspace", "cache", "releases", "staging", "tmp", "data",
    "shared", "logs", "deploy", "mirror", "artifacts",
];

/// Default word list for `words` needle values (own, lowercase, no digits).
#[rustfmt::skip]
pub const VALUE_WORDS: &[&str] = &[
    "amber", "basil", "cedar", "delta", "ember", "falcon", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lagoon", "marble", "nectar", "onyx", "pepper", "quartz", "raven", "saffron",
    "thistle", "umber", "violet", "willow", "yarrow", "zephyr", "bramble", "cobalt", "drizzle",
    "fennel", "glacier", "hazel", "iris", "jasper", "lichen", "magnet", "nutmeg", "orchid",
    "pebble", "quill", "russet", "sorrel", "tundra", "velvet", "walnut", "acorn", "beacon",
    "canyon", "dune", "fjord", "grove",
];
