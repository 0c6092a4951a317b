package main

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/idem-go/idem/idemhttp"
)

// The secrets that keep keys and answers out of a dump of the stores come
// from the environment only: a flag would show them in ps and in shell
// histories.
const (
	// envKeySecret seals idempotency keys (idemhttp.Config.KeySecret): at
	// least 16 bytes, as base64 or hex.
	envKeySecret = "IDEM_KEY_SECRET"
	// envBodyKeys encrypts kept answers (idemhttp.Config.BodyKeys):
	// "ID:KEY[,ID:KEY…]", each KEY 32 bytes as base64 or hex; the first
	// seals, all open.
	envBodyKeys = "IDEM_BODY_KEYS"
)

// atRest is what the environment says about keys and answers at rest.
type atRest struct {
	keySecret []byte
	bodyKeys  []idemhttp.BodyKey
}

// atRestFromEnv reads IDEM_KEY_SECRET and IDEM_BODY_KEYS. Each error names
// the variable, never its value.
func (a *app) atRestFromEnv() (atRest, error) {
	var r atRest
	v, ok, err := a.secretEnv(envKeySecret)
	if err != nil {
		return atRest{}, err
	}
	if ok && strings.TrimSpace(v) != "" {
		b, err := decodeSecret(strings.TrimSpace(v))
		if err != nil {
			return atRest{}, fmt.Errorf("%s: %w", envKeySecret, err)
		}
		if len(b) < idemhttp.MinKeySecretLen {
			return atRest{}, fmt.Errorf("%s is %d bytes; at least %d are needed (e.g. openssl rand -base64 32)", envKeySecret, len(b), idemhttp.MinKeySecretLen)
		}
		r.keySecret = b
	}
	v, ok, err = a.secretEnv(envBodyKeys)
	if err != nil {
		return atRest{}, err
	}
	if ok && strings.TrimSpace(v) != "" {
		for i, item := range strings.Split(v, ",") {
			id, key, found := strings.Cut(strings.TrimSpace(item), ":")
			if !found || id == "" {
				return atRest{}, fmt.Errorf("%s: item %d is not ID:KEY", envBodyKeys, i+1)
			}
			b, err := decodeSecret(key)
			if err != nil {
				return atRest{}, fmt.Errorf("%s: key %q: %w", envBodyKeys, id, err)
			}
			if len(b) != 32 {
				return atRest{}, fmt.Errorf("%s: key %q is %d bytes; AES-256 needs 32 (e.g. openssl rand -base64 32)", envBodyKeys, id, len(b))
			}
			r.bodyKeys = append(r.bodyKeys, idemhttp.BodyKey{ID: id, Key: b})
		}
		// The middleware checks IDs the same way; checking here too refuses
		// a bad variable before anything is opened.
		if _, err := idemhttp.OpenBody(r.bodyKeys, "", "", nil); err != nil {
			return atRest{}, fmt.Errorf("%s: %w", envBodyKeys, err)
		}
	}
	return r, nil
}

// decodeSecret reads a secret written as hex or as base64 (standard or URL
// alphabet, padded or not).
func decodeSecret(s string) ([]byte, error) {
	if b, err := hex.DecodeString(s); err == nil {
		return b, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil {
			return b, nil
		}
	}
	return nil, errors.New("is neither hex nor base64")
}

// secretEnv reads a secret from the environment: the variable name, or,
// when it is not set, the file the variable name+"_FILE" names (a mounted
// secret, as containers and systemd's credentials give them), its
// trailing whitespace trimmed. Secrets are read from there rather than
// from flags, which other users of the machine can read in ps. An error
// names the variable and the file, never what it holds.
func (a *app) secretEnv(name string) (string, bool, error) {
	if v, ok := a.lookupEnv(name); ok {
		return v, true, nil
	}
	path, ok := a.lookupEnv(name + "_FILE")
	if !ok || strings.TrimSpace(path) == "" {
		return "", false, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", false, fmt.Errorf("$%s_FILE: %w", name, err)
	}
	return strings.TrimRight(string(b), " \t\r\n"), true, nil
}
