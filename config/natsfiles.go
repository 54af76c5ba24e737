package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"strings"
)

// checkNATSFiles refuses a credentials or TLS file of an external NATS
// that serve could not use. nats.go reads them when it connects (and
// again at each reconnect), so a path that named nothing passed the check
// and serve then exited with "nats: error loading or parsing rootCA
// file". The embedded server uses none of them. Paths are taken as
// nats.go takes them: relative to the working directory.
func (l *loader) checkNATSFiles(n NATS) {
	if n.URL == "" || !l.natsFiles {
		return
	}
	if n.CredsFile != "" {
		l.readNATSFile(n.CredsFile, "nats.creds_file", "the credentials file (.creds) of the NATS user")
	}
	if n.TLSCA != "" {
		if b, ok := l.readNATSFile(n.TLSCA, "nats.tls_ca", "the CA certificate in PEM"); ok {
			l.check(x509.NewCertPool().AppendCertsFromPEM(b), "nats.tls_ca",
				"%q holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the CA certificate that signed the NATS server's, in PEM", n.TLSCA)
		}
	}
	if n.TLSCert == "" || n.TLSKey == "" {
		return // validateNATS says which one is missing
	}
	certPEM, certOK := l.readNATSFile(n.TLSCert, "nats.tls_cert", "the client certificate in PEM")
	if certOK {
		certOK = hasPEMBlock(certPEM, func(t string) bool { return t == "CERTIFICATE" })
		l.check(certOK, "nats.tls_cert", "%q holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the client certificate, in PEM", n.TLSCert)
	}
	keyPEM, keyOK := l.readNATSFile(n.TLSKey, "nats.tls_key", "the client certificate's private key in PEM")
	if keyOK {
		keyOK = hasPEMBlock(keyPEM, func(t string) bool { return strings.HasSuffix(t, "PRIVATE KEY") })
		l.check(keyOK, "nats.tls_key", "%q holds no PEM private key (-----BEGIN PRIVATE KEY-----): name the client certificate's key, in PEM", n.TLSKey)
	}
	if certOK && keyOK {
		// Its errors name what failed, never the key's bytes.
		_, err := tls.X509KeyPair(certPEM, keyPEM)
		l.check(err == nil, "nats.tls_key", "%q and tls_cert %q are no pair: %v", n.TLSKey, n.TLSCert, err)
	}
}

// readNATSFile reads the file at path, the value of setting, reporting
// why it cannot; what names what the file should be.
func (l *loader) readNATSFile(path, setting, what string) ([]byte, bool) {
	st, err := os.Stat(path)
	if err == nil && st.IsDir() {
		l.check(false, setting, "%q is a directory; name %s", path, what)
		return nil, false
	}
	if err == nil && !st.Mode().IsRegular() {
		// A pipe or a device would hold the check (and each reload) on
		// its read.
		l.check(false, setting, "%q is not a regular file; name %s", path, what)
		return nil, false
	}
	var b []byte
	if err == nil {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		// The path is quoted once: a PathError's message repeats it.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		l.check(false, setting, "%q cannot be read: %v; name %s (a relative path is from the working directory)", path, err, what)
		return nil, false
	}
	return b, true
}

// hasPEMBlock reports whether b holds a PEM block of a type typeOK takes.
func hasPEMBlock(b []byte, typeOK func(string) bool) bool {
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return false
		}
		if typeOK(block.Type) {
			return true
		}
	}
}
