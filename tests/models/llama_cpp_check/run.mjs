// llama.cpp itself over GGUF files (tests/models/llama_cpp_check.py): node-llama-cpp's binding to
// llama.cpp's prebuilt CPU libraries, no GPU, nothing built.
//   node run.mjs JOBS.json RESULTS.json
// JOBS.json: {"jobs": [{"file", "prompt": [ids], "new_tokens", "text"}]}. For each file llama.cpp
// loads the model, evaluates the prompt and takes new_tokens greedy tokens (temperature 0: the
// argmax of each step's logits, no penalties), and encodes `text` without special tokens.
// RESULTS.json: {"llama_cpp": the repository and release of the package's llama.cpp, "results": [{"file", "ids",
// "tokenized", "chat_template", "architecture", "error"}]}; a file llama.cpp refuses gets its
// message in "error". Exits 77 when the package is not installed (the check's rule for a skip).
import fs from "node:fs";

let binding;
try {
  binding = await import("node-llama-cpp");
} catch (e) {
  console.log(`llama_cpp_check: node-llama-cpp is not installed (${e.code ?? e.message}); ` +
              "run `npm install --omit=optional --ignore-scripts` in tests/models/llama_cpp_check");
  process.exit(77);
}
const {getLlama, LlamaLogLevel} = binding;

const [jobsFile, resultsFile] = process.argv.slice(2);
const {jobs} = JSON.parse(fs.readFileSync(jobsFile, "utf8"));
const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error});
const results = [];
for (const job of jobs) {
  const result = {file: job.file};
  try {
    const model = await llama.loadModel({modelPath: job.file});
    const metadata = model.fileInfo.metadata;
    result.architecture = metadata.general.architecture;
    result.chat_template = metadata.tokenizer?.chat_template ?? null;
    result.tokenized = Array.from(model.tokenize(job.text, false));
    const context = await model.createContext({contextSize: 128, threads: 2});
    const ids = [];
    for await (const token of context.getSequence().evaluate(job.prompt, {temperature: 0})) {
      ids.push(token);
      if (ids.length >= job.new_tokens) break;
    }
    result.ids = ids;
    await context.dispose();
    await model.dispose();
  } catch (e) {
    result.error = String(e.message ?? e);
  }
  results.push(result);
}
const {repo, release} = llama.llamaCppRelease;
fs.writeFileSync(resultsFile, JSON.stringify({llama_cpp: `${repo} ${release}`, results}, null, 1));
await llama.dispose();
