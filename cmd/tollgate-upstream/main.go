// Command tollgate-upstream runs proxytest's fake OpenAI-compatible upstream
// on its own, so `make run` has something to forward to without a GPU: its
// default address is the default UPSTREAM_BASE_URL of gateway.yaml.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/tollgate/tollgate/proxy/proxytest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8000", "listen address")
	var o proxytest.Options
	flag.IntVar(&o.Chunks, "chunks", 20, "words per answer; one stream event per word")
	flag.DurationVar(&o.ChunkDelay, "chunk-delay", 0, "wait between stream events, e.g. 20ms")
	flag.DurationVar(&o.FirstByteDelay, "first-byte-delay", 0, "wait before answering")
	flag.IntVar(&o.PromptTokens, "prompt-tokens", 10, "prompt_tokens reported in usage")
	flag.IntVar(&o.CachedTokens, "cached-tokens", 0, "cached prompt tokens reported in usage")
	flag.IntVar(&o.ReasoningTokens, "reasoning-tokens", 0, "reasoning tokens reported in usage")
	flag.BoolVar(&o.ClassifierAnswers, "classifier-answers", true, "answer the llm classifier engine's prompts with JSON and logprobs")
	flag.Parse()
	// A long-running process must not keep every request it ever served.
	o.NoRecord = true

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "tollgate-upstream: listening on %s: %v\n", *addr, err)
		os.Exit(1)
	}
	s := proxytest.NewServerOn(ln, o)
	fmt.Println(s.URL)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	s.Close()
}
