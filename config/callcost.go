package config

import (
	"fmt"
	"strings"

	"github.com/tollgate/tollgate/money"
)

// MaxReportedTokens bounds each count of a call's usage the gateway
// believes from an upstream (prompt, completion, cached, reasoning): a
// hundred times the largest context window served today. A report past
// it is not believed (proxy uses it as its maxReportedTokens).
const MaxReportedTokens = 100_000_000

// minImagePartBytes is the smallest image part of a request,
// {"type":"image_url"} (the responses API's {"type":"input_image"} is
// longer): a body of server.max_request_body holds at most that many
// divided by it, each billed at the image price.
const minImagePartBytes = len(`{"type":"image_url"}`)

// callCostPart is one term of a call's largest cost: count units (token,
// image, request) of a price, written at key.
type callCostPart struct {
	key   string
	count int64
	unit  string
	price money.Price
}

// checkCallCost refuses prices at which one call can cost more than the
// billing consumer accepts for one usage event (money.MaxEventCost): it
// refuses such an event, leaving the call unbilled, and the gateway then
// counted its charge against the account until restart. parts are the
// terms of the call's largest cost; what each says is in how, and the
// error names the largest price of the costliest term that fits with the
// others as they are. The error is at that term's key, under path.
func (l *loader) checkCallCost(path, how string, parts []callCostPart) {
	var sum money.Atto
	worst, worstCost := 0, money.Nanos(-1)
	for i, p := range parts {
		sum.Add(p.count, p.price)
		var one money.Atto
		one.Add(p.count, p.price)
		if c := one.Nanos(); c > worstCost {
			worst, worstCost = i, c
		}
	}
	cost := sum.Nanos()
	if cost <= money.MaxEventCost {
		return
	}
	var others money.Atto
	for i, p := range parts {
		if i != worst {
			others.Add(p.count, p.price)
		}
	}
	w := parts[worst]
	name := strings.ReplaceAll(w.key, "_", " ")
	if !strings.HasPrefix(name, "price") {
		name += " price"
	}
	largest := money.LargestPrice(money.MaxEventCost-others.Nanos(), w.count)
	l.check(false, path+"."+w.key,
		"%q lets one call cost %s USD (%s), more than the %s USD billing accepts for one call, which it would leave unbilled: "+
			"the largest %s here is %s USD per %s",
		w.price.String(), cost, how, money.MaxEventCost, name, largest, w.unit)
}

// checkModelCallCost bounds a model's prices (see checkCallCost): its
// largest call is MaxReportedTokens prompt tokens at the higher of prompt
// and input_cache_read, as many completion tokens, as many images as
// server.max_request_body holds, and the request.
func (l *loader) checkModelCallCost(path string, p Pricing, maxBody ByteSize) {
	prices := map[string]money.Price{}
	for key, s := range map[string]string{
		"prompt": p.Prompt, "completion": p.Completion, "image": p.Image,
		"request": p.Request, "input_cache_read": p.InputCacheRead,
	} {
		if s == "" {
			continue
		}
		v, err := parsePrice(s)
		if err != nil {
			return // reported already
		}
		prices[key] = v
	}
	promptKey := "prompt"
	if p.InputCacheRead != "" && prices["input_cache_read"] > prices["prompt"] {
		promptKey = "input_cache_read"
	}
	images := int64(maxBody) / int64(minImagePartBytes)
	parts := []callCostPart{
		{promptKey, MaxReportedTokens, "token", prices[promptKey]},
		{"completion", MaxReportedTokens, "token", prices["completion"]},
		{"image", images, "image", prices["image"]},
		{"request", 1, "request", prices["request"]},
	}
	how := fmt.Sprintf("%d prompt and %d completion tokens, the most believed from an upstream", MaxReportedTokens, MaxReportedTokens)
	if prices["image"] != 0 {
		how += fmt.Sprintf(", %d images, as many as server.max_request_body holds", images)
	}
	if prices["request"] != 0 {
		how += ", and the request"
	}
	l.checkCallCost(path+".pricing", how, parts)
}

// checkTokenPriceCallCost bounds a price per token of the plugin
// endpoints or batch lines (see checkCallCost) as a model's prompt and
// completion prices together are: its largest call is taken to be
// MaxReportedTokens prompt and as many completion tokens.
func (l *loader) checkTokenPriceCallCost(path, key, price string) {
	v, err := parsePrice(price)
	if err != nil {
		return // reported already
	}
	l.checkCallCost(path, fmt.Sprintf("%d tokens, a call's prompt and completion at the most believed from an upstream", 2*MaxReportedTokens),
		[]callCostPart{{key, 2 * MaxReportedTokens, "token", v}})
}
