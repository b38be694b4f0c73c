#!/usr/bin/env python3
"""Writes tests/data/tokjson_strings.json: the strings
test_tokjson_matches_ref encodes with memfit and with the reference
(tests/ref/tokjson_ref.js). Deterministic: fixed lists and combinations, no
randomness. Moby-Dick lines are added by the test at run time.

    python3 tests/data/gen_tokjson_strings.py > tests/data/tokjson_strings.json
"""
import json

words = {
    "latin": ["Hello", "world", "café", "naïve", "résumé", "über", "Straße", "façade", "jalapeño",
              "Ærøskøbing", "Łódź", "Škoda", "İstanbul", "ﬁne", "Ünïcödé"],
    "cjk": ["日本語のテキスト", "中文测试。", "你好，世界！", "한국어 텍스트", "東京タワー", "漢字かな交じり文"],
    "arabic": ["مرحبا بالعالم", "اللغة العربية", "٣٤٥ ١٢"],
    "hindi": ["नमस्ते दुनिया", "हिन्दी भाषा", "१२३ संख्या"],
    "cyrillic": ["Привет мир", "Съешь же ещё этих мягких французских булок", "ЁЛКА ёлка"],
    "greek": ["Γειά σου Κόσμε", "ΑΒΓ αβγ"],
    "thai": ["สวัสดีชาวโลก"],
    "hebrew": ["שלום עולם"],
}
emoji = ["😀", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "✊🏿", "🧑🏻‍🤝‍🧑🏿", "1️⃣", "🤷‍♀️"]
spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n", " \n ", "\t \n", "    ", " \t\n\r "]
numbers = ["0", "7", "42", "123", "1234", "12345", "1234567", "3.14159", "1,000,000", "2024-01-31",
           "99999999999999999999", "0.000001", "1e-10", "-273.15", "+1 (555) 010-9999", "٣٤٥", "१२३", "½", "Ⅻ", "x²"]
contr = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Re", "'lL"]
punct = ["!!!", "???", "...", "---", ";;;", "()[]{}", "<<>>", "@#$%^&*", "¿¡", "«»", "“quoted”", "‘single’",
         "—", "–", "…", "·", "§¶", "→←", "™©®", "\\", "/", "|", "~`", "\"", "'", "''", "' '"]
code = [
    "def foo(x):\n    return x + 1\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
    "if x == 1:\n\tprint('hi')\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "const f = (a, b) => a ?? b; // nullish",
    "SELECT * FROM users WHERE id = 42;",
    "<div class=\"x\">Hello</div>",
    "https://example.com/path?q=1&r=2#frag",
    "x = f(y) + 2*z; // comment",
    "    \n        \n",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "a_b_c __init__ snake_case camelCase PascalCase kebab-case",
    "$ ls -la | grep '^d' > out.txt 2>&1",
]
special = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|im_start|>",
           "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<think>", "</think>", "<tool_call>"]
nfd = ["e\u0301", "Cafe\u0301", "A\u030a", "n\u0303o", "u\u0308ber", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",
       "o\u0302\u0323", "o\u0323\u0302", "q\u0307\u0323", "\u212b", "\u2126", "\u00c5\u0301", "s\u0323\u0307",
       "\u0915\u093c", "\u30ab\u3099", "\u0041\u0300\u0301\u0302"]

S = []
add = S.append
add("")
add("Hello world")
add("The quick brown fox jumps over the lazy dog.")
for group in words.values():
    for w in group:
        add(w)
        add(" " + w)
        add(w + " ")
    add(" ".join(group))
for e in emoji:
    add(e)
    add("emoji " + e + " and " + e + e + "!")
add("".join(emoji))
for s in spaces:
    add(s)
    add("a" + s + "b")
    add(s + "leading")
    add("trailing" + s)
    add("x" + s + s + "y" + s)
for n in numbers:
    add(n)
    add("pay " + n + " now")
    add(n + n)
for c in contr:
    add("it" + c)
    add("IT" + c + " there")
    add(c)
add("it's don't they're we've I'm you'll he'd")
add("IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D")
add("Mr. O'Neill's dog''s ' '' 's")
for p in punct:
    add(p)
    add("word" + p + "word")
    add(" " + p + " ")
for c in code:
    add(c)
for t in special:
    add(t)
    add("Hello" + t + "World")
    add("a " + t + " b")
    add(t + t)
    add(" " + t + "\n")
    add(t[:-1])
    add(t.upper())
add("<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n")
add("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>")
add("<s>[INST] Hello [/INST] Hi</s>")
for s in nfd:
    add(s)
    add("word " + s + " word")
# mixtures
mixes = [("latin", "cjk"), ("arabic", "latin"), ("hindi", "cyrillic"), ("cjk", "greek"), ("thai", "hebrew")]
for a, b in mixes:
    for i in range(3):
        add(words[a][i % len(words[a])] + words[b][i % len(words[b])] + " " + emoji[i] + " " + numbers[i + 3])
add("a" * 300)
add("ab" * 200)
add(" " * 100 + "x")
add("\n" * 50)
add("1" * 200)
add("x" * 40 + " " + "y" * 40)
add("Antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis")
seen = set()
out = []
for s in S:
    if s not in seen:
        seen.add(s)
        out.append(s)
print(json.dumps(out, ensure_ascii=False, indent=0))
