package accounts

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/broker"
	"github.com/tollgate/tollgate/internal/durable"
)

// SigningKeyFile is the name of the Ed25519 key under data_dir that signs
// API keys. Every gateway of a cluster must hold the same file: copy it from
// the first gateway's data_dir before starting the others, or keys issued by
// one gateway are refused by the rest.
const SigningKeyFile = "signing.key"

// loadOrCreateSigningKey reads <dataDir>/signing.key, generating it on the
// first start. The new file appears atomically and is never overwritten, so
// two processes starting together on one data_dir end up with the same key.
func loadOrCreateSigningKey(dataDir string) (ed25519.PrivateKey, error) {
	path := filepath.Join(dataDir, SigningKeyFile)
	key, err := readSigningKey(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return key, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	_, fresh, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(fresh)
	if err != nil {
		return nil, fmt.Errorf("encoding signing key: %w", err)
	}
	// Of two processes starting at once, one creates it and both load
	// that one key.
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if _, err := durable.CreateFile(path, pemKey); err != nil {
		return nil, fmt.Errorf("writing signing key: %w", err)
	}
	return readSigningKey(path)
}

func readSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading signing key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("signing key %s: not a PEM PRIVATE KEY block; delete it to generate a new one (all issued API keys stop working)", path)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	key, ok := parsed.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s: %T, want an Ed25519 key", path, parsed)
	}
	return key, nil
}

func publicOf(k ed25519.PrivateKey) ed25519.PublicKey {
	if k == nil {
		return nil
	}
	return k.Public().(ed25519.PublicKey)
}

// errNoSigningKey: the service was opened without a data dir.
var errNoSigningKey = errors.New("this process holds no signing key: keys are issued and checked by tollgate serve")

// checkSharedSigningKey publishes pub as the signing key of the gateways
// on this NATS, or, if one is published already, refuses pub unless it is
// that one. A gateway started without the shared signing.key accepted only
// the keys it issued itself, and issued keys the others refused: behind a
// load balancer, one call in N failed with "bad signature", and nothing
// said why.
func checkSharedSigningKey(ctx context.Context, js jetstream.JetStream, replicas int, pub ed25519.PublicKey, dataDir string) error {
	kv, err := broker.EnsureKV(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketSigning,
		Description: "the public key that signs API keys, the same on every gateway",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return err
	}
	published, err := broker.PublishOrRead(ctx, kv, "public", pub)
	if err != nil {
		return fmt.Errorf("checking the shared signing key: %w", err)
	}
	if !bytes.Equal(published, pub) {
		return fmt.Errorf("%s (public key %s) is not the signing key published on this NATS (public key %s, in KV bucket %s): "+
			"API keys issued with one are refused with the other. Copy signing.key from another gateway's data_dir into %s; "+
			"or, to replace the signing key on purpose (every API key issued stops working), stop every gateway and delete the published one "+
			"(nats kv del %s public)",
			filepath.Join(dataDir, SigningKeyFile), fingerprint(pub), fingerprint(published), BucketSigning, dataDir, BucketSigning)
	}
	return nil
}

// fingerprint names a public key in messages: the first 8 bytes of its
// SHA-256.
func fingerprint(pub []byte) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}
