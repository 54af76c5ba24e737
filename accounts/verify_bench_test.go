package accounts

import (
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/money"
)

// benchKeys creates an account with n keys and returns their tokens.
func benchKeys(b *testing.B, n int) (*Service, [][]byte) {
	s, _, _ := gateway(b)
	ctx := testContext(b)
	if _, err := s.CreateAccount(ctx, "bench", money.NanosPerUSD); err != nil {
		b.Fatal(err)
	}
	tokens := make([][]byte, n)
	for i := range tokens {
		_, token, err := s.CreateKey(ctx, "bench", KeyRequest{Name: "k" + strconv.Itoa(i), Scopes: []string{ScopeGenerate}})
		if err != nil {
			b.Fatal(err)
		}
		tokens[i] = []byte(token)
	}
	b.ResetTimer()
	return s, tokens
}

func BenchmarkVerifyCached(b *testing.B) {
	s, tokens := benchKeys(b, 1)
	if _, err := s.Verify(tokens[0]); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Verify(tokens[0]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkVerifyUncached(b *testing.B) {
	s, tokens := benchKeys(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		// Emptying the cache each time forces the signature check.
		s.cacheMu.Lock()
		clear(s.cache)
		s.cacheMu.Unlock()
		if _, err := s.Verify(tokens[0]); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyRejectForged(b *testing.B) {
	s, tokens := benchKeys(b, 1)
	forged := append([]byte(nil), tokens[0]...)
	forged[len(forged)-2] ^= 1
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Verify(forged); err == nil {
			b.Fatal("forged token accepted")
		}
	}
}

func BenchmarkBalance(b *testing.B) {
	s, _ := benchKeys(b, 0)
	s.NoteCharge("bench", 1) // as for an account this gateway has charged
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, ok := s.Balance("bench"); !ok {
				b.Fatal("no balance")
			}
		}
	})
}

// NoteCharge runs once per metered call.
func BenchmarkNoteCharge(b *testing.B) {
	s, _ := benchKeys(b, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.NoteCharge("bench", 1)
		}
	})
}
