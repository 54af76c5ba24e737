package config

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
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
		l.readSettingFile(n.CredsFile, "nats.creds_file", "the credentials file (.creds) of the NATS user")
	}
	if n.TLSCA != "" {
		if b, ok := l.readSettingFile(n.TLSCA, "nats.tls_ca", "the CA certificate in PEM"); ok {
			l.check(x509.NewCertPool().AppendCertsFromPEM(b), "nats.tls_ca",
				"%q holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the CA certificate that signed the NATS server's, in PEM", n.TLSCA)
		}
	}
	if n.TLSCert == "" || n.TLSKey == "" {
		return // validateNATS says which one is missing
	}
	certPEM, certOK := l.readSettingFile(n.TLSCert, "nats.tls_cert", "the client certificate in PEM")
	if certOK {
		certOK = hasPEMBlock(certPEM, func(t string) bool { return t == "CERTIFICATE" })
		l.check(certOK, "nats.tls_cert", "%q holds no PEM certificate (-----BEGIN CERTIFICATE-----): name the client certificate, in PEM", n.TLSCert)
	}
	keyPEM, keyOK := l.readSettingFile(n.TLSKey, "nats.tls_key", "the client certificate's private key in PEM")
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
