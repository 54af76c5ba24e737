package accounts

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	tmp, err := os.CreateTemp(dataDir, SigningKeyFile+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("writing signing key: %w", err)
	}
	defer os.Remove(tmp.Name())
	// CreateTemp makes the file 0600 already; the key never exists with
	// wider permissions.
	if err := pem.Encode(tmp, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing signing key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("writing signing key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("writing signing key: %w", err)
	}
	// Link, unlike rename, fails when the target exists: a concurrent
	// starter that won the race keeps its key and we load that one.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("installing signing key: %w", err)
	}
	syncDir(dataDir)
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

// syncDir makes a new directory entry durable; failure only weakens
// durability, so it is not reported.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}
