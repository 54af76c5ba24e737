// Command tollgate-upstream runs proxytest's fake OpenAI-compatible upstream
// on its own, so `make run` has something to forward to without a GPU: its
// default address is the default UPSTREAM_BASE_URL of gateway.yaml.
//
// It answers the llm classifier engine's prompts from the offline engine's
// view (classifiers.ViewModel), with log-probabilities that say what that
// engine said, so that classify, tag, score and match through the demo
// give the offline engine's answers by way of the whole llm path, not a
// fixed label at a fixed confidence. That engine is the semantic one when
// the word vectors are installed (-vectors; scripts/vectors.sh, which
// make run calls), as the gateway's own offline answers are, else lexical.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate/tollgate/classifiers"
	"github.com/tollgate/tollgate/config"
	"github.com/tollgate/tollgate/proxy/proxytest"
)

// offlineView is the engine the fake model answers classifier prompts
// with: semantic over the vectors at path, or lexical when path is empty
// or cannot be loaded (why goes to logf, once, at start).
func offlineView(path string, logf func(string, ...any)) classifiers.Engine {
	if path == "" {
		return classifiers.NewLexical()
	}
	v, err := classifiers.LoadVectors(path)
	if err != nil {
		// A corrupt file's error names it and the fix already.
		if !errors.Is(err, classifiers.ErrVectorsCorrupt) {
			err = fmt.Errorf("%w (scripts/vectors.sh install)", err)
		}
		logf("tollgate-upstream: classifier prompts answered from the lexical engine: %v", err)
		return classifiers.NewLexical()
	}
	return classifiers.NewSemantic(v)
}

// defaultVectors is where the gateway's default config finds the vectors.
func defaultVectors() string {
	return cmp.Or(os.Getenv("TOLLGATE_VECTORS"), config.DefaultVectors)
}

func main() {
	s, err := start(os.Args[1:], os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-upstream: %v\n", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	s.Close()
}

// start parses the flags, listens and prints the base URL to out.
func start(args []string, out io.Writer) (*proxytest.Server, error) {
	fs := flag.NewFlagSet("tollgate-upstream", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8000", "listen address")
	var o proxytest.Options
	fs.IntVar(&o.Chunks, "chunks", 20, "words per answer; one stream event per word")
	fs.DurationVar(&o.ChunkDelay, "chunk-delay", 0, "wait between stream events, e.g. 20ms")
	fs.DurationVar(&o.FirstByteDelay, "first-byte-delay", 0, "wait before answering")
	fs.IntVar(&o.PromptTokens, "prompt-tokens", 10, "prompt_tokens reported in usage")
	fs.IntVar(&o.CachedTokens, "cached-tokens", 0, "cached prompt tokens reported in usage")
	fs.IntVar(&o.ReasoningTokens, "reasoning-tokens", 0, "reasoning tokens reported in usage")
	classifierAnswers := fs.Bool("classifier-answers", true, "answer the llm classifier engine's prompts from the offline engine's view, with logprobs")
	fs.BoolVar(&o.NoLogprobs, "no-logprobs", false, "leave logprobs out of classifier answers, like upstreams that ignore them")
	// Failures, to try a pool's health rules on one member.
	fs.IntVar(&o.Status, "status", 0, "answer every request, GET /v1/models included, with this status and an OpenAI error body, e.g. 503 or 429")
	fs.StringVar(&o.RetryAfter, "retry-after", "", "with -status, the Retry-After header sent, e.g. 5")
	fs.IntVar(&o.DropAfter, "drop-after", 0, "close a stream's connection after this many events, as a replica that crashes mid-answer")
	fs.BoolVar(&o.Stall, "stall", false, "send nothing after a stream's first event, as a replica that hangs mid-answer")
	vectors := fs.String("vectors", defaultVectors(), "word vectors of the semantic engine that classifier answers come from; empty: the lexical engine")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *classifierAnswers {
		o.Reply = classifiers.NewViewModel(offlineView(*vectors, log.Printf)).Reply
	}
	// A long-running process must not keep every request it ever served.
	o.NoRecord = true

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", *addr, err)
	}
	s := proxytest.NewServerOn(ln, o)
	fmt.Fprintln(out, s.URL)
	return s, nil
}
