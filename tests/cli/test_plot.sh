#!/usr/bin/env bash
# ft plot (DESIGN.md §4): the runs' metrics drawn as SVG (by ft) and PNG (through cairo), read
# back by tests/cli/plot_check.py with Debian's python3 alone.
#  1. Two tiny CPU runs with evaluations: `a` (fp32) killed as step 5 begins and resumed from
#     step 3's checkpoint, so steps 4 and the evaluation at 4 are in metrics.jsonl twice; `b`
#     (fp16, at an initial loss scale of 2^20 its first steps overflow: null grad_norm); and a
#     hand-written file `c.jsonl` (a step repeated with other values, a null loss, a cut-short
#     last line: a warning). `ft plot a b c.jsonl --output x.svg`: the SVG is well-formed, has
#     exactly the panels with data, and every run's curve of every metric, inverted through its
#     panel's transform, is metrics.jsonl's values at its steps (the last line of a step
#     counting), the smoothed loss TensorBoard's debiased EMA of them (--smooth 0.8).
#  2. librsvg's rsvg-convert (Debian's librsvg2-bin, an independent renderer) renders the SVG:
#     not blank, and each run's colour is in the loss panel.
#  3. --output x.png (cairo, opened at run time): the PNG decodes (our own reader: chunk CRCs,
#     inflate, the five filters) to the --width x --height asked, not one colour, the runs'
#     colours in the loss panel. A host where libcairo.so.2 cannot be loaded (FT_TEST_CAIRO_LIBRARY
#     names one that is not there) is refused, exit 2, naming it and the way out.
#  4. Bad input: a missing folder, a folder without metrics.jsonl, an unknown extension, a line
#     that is not JSON (file:line), --labels of the wrong count, --smooth out of range: exit 2;
#     an output folder that does not exist: exit 1.
#  5. The README's picture (docs/plot_example.svg, made by ft plot) renders with rsvg-convert,
#     not blank, both runs' colours in its loss panel.
#   bash tests/cli/test_plot.sh BUILD_DIR SOURCE_DIR
source "$2/tests/cli/common.sh" "$@"
fail() { fail_showing_output "$@"; }
t0=$SECONDS
check=("/usr/bin/python3" "$src/tests/cli/plot_check.py")
command -v rsvg-convert > /dev/null ||
  fail "rsvg-convert not found: install Debian's librsvg2-bin (scripts/setup.sh lists it)"

/usr/bin/python3 "$src/tests/ref/make_shards.py" "$tmp/train:2" "$tmp/valid:1" --vocab 97 \
  --samples 24 --seq-len 16 --seed 0 > /dev/null
cat > "$tmp/r.yaml" <<YAML
run: {name: p, output_dir: $tmp/a, seed: 3}
model: {dim: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2, ffn_dim: 48, vocab_size: 97, max_seq_len: 32}
data: {train: $tmp/train, valid: $tmp/valid, seq_len: 16}
training: {steps: 8, micro_batch_size: 2, global_batch_size: 4, eval_every_steps: 2,
           eval_batches: 1}
optimizer: {lr: 0.01}
checkpoint: {every_steps: 3}
runtime: {threads: 2}
YAML

# 1. Run a: killed as step 5 begins (steps 1-4 and evaluations at 2 and 4 logged, step_3 saved),
# resumed: steps 4-8 again. Run b: fp16, other lr, uninterrupted.
FT_TEST_KILL_AT_STEP=5 run_rc 137 "$ft" train "$tmp/r.yaml"
run_rc 0 "$ft" train "$tmp/r.yaml"
(($(grep -cE '"step":4[,}]' "$tmp/a/metrics.jsonl") >= 3)) ||
  fail "run a should log step 4 (and its evaluation) twice: $(cat "$tmp/a/metrics.jsonl")"
run_rc 0 "$ft" train "$tmp/r.yaml" run.output_dir="$tmp/b" training.precision=fp16 \
  training.initial_loss_scale=1048576 optimizer.lr=0.003
grep -q '"grad_norm":null' "$tmp/b/metrics.jsonl" || fail "run b has no skipped step"
# c: by hand. Step 2 twice (the later counts), a null loss at 3, an evaluation, a checkpoint line,
# large and tiny values, and a last line cut short.
printf '%s\n' \
  '{"step":1,"loss":9.5,"lr":1e-5,"grad_norm":120.0,"tokens_per_s":2.5e6,"mem_peak_bytes":3221225472}' \
  '{"step":2,"loss":7.0,"lr":2e-5,"grad_norm":30.0,"tokens_per_s":2.4e6,"mem_peak_bytes":3221225472}' \
  '{"step":2,"loss":6.0,"lr":2e-5,"grad_norm":0.05,"tokens_per_s":2.6e6,"mem_peak_bytes":3758096384}' \
  '{"step":2,"ckpt_step":2,"ckpt_bytes":1000}' \
  '{"step":3,"loss":null,"lr":3e-5,"grad_norm":null,"tokens_per_s":2.5e6,"skipped":true}' \
  '{"step":4,"loss":5.5,"lr":3e-5,"grad_norm":0.5,"tokens_per_s":2.5e6,"mem_peak_bytes":3758096384}' \
  '{"step":4,"eval_loss":6.25}' > "$tmp/c.jsonl"
printf '{"step":5,"loss":5' >> "$tmp/c.jsonl"

run_rc 0 "$ft" plot "$tmp/a" "$tmp/b/" "$tmp/c.jsonl" --output "$tmp/x.svg" --smooth 0.8 \
  --width 900
has_err "warning: $tmp/c.jsonl:8: the last line is cut short"
has_out "wrote $tmp/x.svg (900x"
has_out "3 runs; panels: loss, lr, tokens_per_s, tflops, grad_norm, memory"
height=$(sed -n 's/^wrote .* (900x\([0-9]*\) pixels).*/\1/p' "$tmp/out.txt")
[[ -n $height ]] || fail "no size in ft plot's output"
"${check[@]}" svg "$tmp/x.svg" 0.8 "$tmp/a" "$tmp/b" "$tmp/c.jsonl" > "$tmp/out.txt" ||
  fail "the SVG's drawn points"
cat "$tmp/out.txt"
has_out "labels {'0': 'a', '1': 'b', '2': 'c'}"

# 2. rsvg-convert renders it (at its own size): not blank, each run's colour in the loss panel.
rsvg-convert --background-color=white -o "$tmp/x_rsvg.png" "$tmp/x.svg" ||
  fail "rsvg-convert could not render the SVG"
"${check[@]}" png "$tmp/x_rsvg.png" 900 "$height" --svg "$tmp/x.svg" > "$tmp/out.txt" ||
  fail "rsvg-convert's render"
cat "$tmp/out.txt"

# 3. PNG through cairo, at the size asked; its loss panel is where the same-size SVG's is.
dpkg-query -W -f='${Status}' libcairo2 2> /dev/null | grep -q "install ok installed" ||
  fail "libcairo2 is not installed (scripts/setup.sh lists it): the PNG cannot be tested"
run_rc 0 "$ft" plot "$tmp/a" "$tmp/b" --output "$tmp/x.PNG" --width 640 --height 520 \
  --labels 'fp32 resumed',fp16
has_out "wrote $tmp/x.PNG (640x520 pixels): 2 runs"
run_rc 0 "$ft" plot "$tmp/a" "$tmp/b" --output "$tmp/same.svg" --width 640 --height 520 \
  --labels "fp32 <resumed>" --labels "fp16 & co"
"${check[@]}" png "$tmp/x.PNG" 640 520 --svg "$tmp/same.svg" > "$tmp/out.txt" || fail "the PNG"
cat "$tmp/out.txt"
grep -qF '>fp32 &lt;resumed&gt;</text>' "$tmp/same.svg" || fail "--labels not in the legend"
FT_TEST_CAIRO_LIBRARY=libft_no_cairo.so.2 run_rc 2 "$ft" plot "$tmp/a" --output "$tmp/y.png"
has_err "a .png output needs cairo (libft_no_cairo.so.2), which cannot be loaded here"
has_err "write an .svg instead (--output FILE.svg), or install cairo (Debian and Ubuntu: apt-get install libcairo2)"
[[ ! -e $tmp/y.png ]] || fail "a PNG was written without cairo"

# 4. Bad input.
run_rc 2 "$ft" plot "$tmp/nowhere" --output "$tmp/z.svg"
has_err "ft: error: \"$tmp/nowhere\" does not exist; give a run's run.output_dir"
mkdir "$tmp/empty"
run_rc 2 "$ft" plot "$tmp/a" "$tmp/empty" --output "$tmp/z.svg"
has_err "folder \"$tmp/empty\" holds no metrics.jsonl"
run_rc 2 "$ft" plot "$tmp/a" --output "$tmp/z.pdf"
has_err "--output \"$tmp/z.pdf\": the picture's kind comes from its extension, which must be .svg or .png"
printf '{"step":1,"loss":2}\n{"step":2,"loss":\n{"step":3,"loss":1}\n' > "$tmp/bad.jsonl"
run_rc 2 "$ft" plot "$tmp/bad.jsonl" --output "$tmp/z.svg"
has_err "ft: error: $tmp/bad.jsonl:2: not valid JSON"
run_rc 2 "$ft" plot "$tmp/a" "$tmp/b" --labels one --output "$tmp/z.svg"
has_err "--labels names 1 run but 2 are given"
run_rc 2 "$ft" plot "$tmp/a" --smooth 1 --output "$tmp/z.svg"
has_err "--smooth"
run_rc 1 "$ft" plot "$tmp/a" --output "$tmp/no_dir/z.svg"
has_err "cannot write $tmp/no_dir/z.svg"
[[ ! -e $tmp/z.svg ]] || fail "a refused plot wrote its output"

# 5. The README's picture.
readme_svg="$src/docs/plot_example.svg"
rsvg-convert -o "$tmp/readme.png" "$readme_svg" || fail "rsvg-convert could not render $readme_svg"
size=($(sed -n 's/^<svg .* width="\([0-9]*\)" height="\([0-9]*\)".*/\1 \2/p' "$readme_svg"))
"${check[@]}" png "$tmp/readme.png" "${size[@]}" --svg "$readme_svg" > "$tmp/out.txt" ||
  fail "the README's picture"
echo "test_plot: ok ($((SECONDS - t0)) s)"
