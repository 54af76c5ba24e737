// Command tollgate-eval measures a classification engine on the labelled
// parts in classifiers/testdata/eval (`make eval`): dev and dev2, which
// the engine was tuned on, dev3 (classify only), written to choose between
// engines and never tuned on, and test, written before any tuning and
// never used to tune (-parts picks some of them). It prints one table per part:
// classify accuracy with every item asked in two label orders, score
// pairs ordered right, match MRR, NDCG@5 and traps. With -bench it
// measures latency per call and the memory the engine adds instead (`make
// bench`). The evaluation output is deterministic.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/tollgate/tollgate/classifiers"
)

// parts are evaluated in this order, each with what the output says of it.
var parts = []struct{ name, about string }{
	{"dev", "the tuning part, written with the engine and its cue lists; tune on this one"},
	{"dev2", "the second tuning part, new domains written before the engine was tuned for them; tune on this one too"},
	{"dev3", "a classify-only part written on 2026-11-26 to choose between engines, measured before any tuning on it; do not tune on it"},
	{"test", "the held-out part, written before any tuning; never tune on it"},
}

// defaultParts is what -parts names when not given: all of them.
const defaultParts = "dev,dev2,dev3,test"

// selectParts turns -parts' comma-separated names into indexes of parts,
// in parts' order; an unknown name is an error naming the known ones.
func selectParts(list string) ([]int, error) {
	want := make(map[string]bool)
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	var idx []int
	known := make([]string, len(parts))
	for i, pi := range parts {
		known[i] = pi.name
		if want[pi.name] {
			idx = append(idx, i)
			delete(want, pi.name)
		}
	}
	for n := range want {
		return nil, fmt.Errorf("unknown part %q: choose among %s", n, strings.Join(known, ", "))
	}
	if len(idx) == 0 {
		return nil, fmt.Errorf("-parts names no part: choose among %s", strings.Join(known, ", "))
	}
	return idx, nil
}

func main() {
	root := flag.String("dir", "classifiers/testdata/eval", "directory holding the dev, dev2, dev3 and test parts")
	partList := flag.String("parts", defaultParts, "comma-separated parts to evaluate or bench (tune with dev,dev2)")
	engine := flag.String("engine", defaultEngine, "engine to measure: "+strings.Join(engineNames(), ", "))
	bench := flag.Bool("bench", false, "measure latency per call and the memory the engine adds, instead of quality")
	rounds := flag.Int("rounds", 30, "with -bench: passes over the evaluation texts per operation")
	calibrate := flag.Bool("calibrate", false, "with -engine llm: fit the calibration temperature on the dev part's classify items instead")
	flag.Parse()
	var err error
	if *calibrate {
		err = calibrateLLM(os.Stdout, *root, *engine)
	} else {
		err = run(os.Stdout, *root, *engine, *partList, *bench, *rounds)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-eval: %v\n", err)
		os.Exit(1)
	}
}

func run(w io.Writer, root, engineName, partList string, bench bool, rounds int) error {
	newEngine, ok := engines[engineName]
	if !ok {
		return fmt.Errorf("unknown engine %q: choose one of %s", engineName, strings.Join(engineNames(), ", "))
	}
	chosen, err := selectParts(partList)
	if err != nil {
		return err
	}
	loaded := make([]*part, 0, len(chosen))
	for _, i := range chosen {
		p, err := load(parts[i].name, filepath.Join(root, parts[i].name))
		if err != nil {
			return err
		}
		loaded = append(loaded, p)
	}
	if bench {
		return runBench(w, engineName, newEngine, loaded, rounds)
	}
	engine, err := newEngine()
	if err != nil {
		return fmt.Errorf("starting the %s engine: %w", engineName, err)
	}
	for i, p := range loaded {
		if i > 0 {
			fmt.Fprintln(w)
		}
		r, err := evaluate(w, engine, p, parts[chosen[i]].about)
		if err != nil {
			return err
		}
		if p.name == "test" && engineName != classifiers.EngineLLM {
			reportGoals(w, r)
		}
	}
	return nil
}

// calibrateLLM fits the llm engine's temperature on the dev part only: the
// test part never tunes anything.
func calibrateLLM(w io.Writer, root, engineName string) error {
	if engineName != classifiers.EngineLLM {
		return fmt.Errorf("-calibrate fits the llm engine's temperature; use it with -engine %s", classifiers.EngineLLM)
	}
	dev, err := load("dev", filepath.Join(root, "dev"))
	if err != nil {
		return err
	}
	engine, err := llmEngineFromEnv()
	if err != nil {
		return err
	}
	var reqs []classifiers.ClassifyRequest
	var gold []string
	for _, it := range dev.classify {
		ls := dev.sets[it.Set]
		reqs = append(reqs, classifiers.ClassifyRequest{Text: it.Text, Labels: it.Labels, Mode: classifiers.ModeSingle,
			Descriptions: ls.Descriptions, Examples: ls.Examples})
		gold = append(gold, it.Label)
	}
	line, err := llmCalibration(context.Background(), engine, reqs, gold)
	if err != nil {
		return err
	}
	fmt.Fprintln(w, line)
	return nil
}
