package cli

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// RedactURL returns raw with the password of its user info replaced by
// "xxxxx", for logs and error messages. A URL that does not parse is
// redacted by hand: its whole user info but a user name before ':' is
// masked.
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	head, ui, tail, ok := splitUserInfo(raw)
	if !ok {
		return raw
	}
	if user, _, hasPass := strings.Cut(ui, ":"); hasPass {
		return head + user + ":xxxxx" + tail
	}
	return head + "xxxxx" + tail
}

// URLProblem explains why raw does not parse as a URL without repeating
// any part of its user info (which may hold a password); "" if it parses.
func URLProblem(raw string) string {
	_, err := url.Parse(raw)
	if err == nil {
		return ""
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = ue.Err.Error()
	}
	if _, ui, _, ok := splitUserInfo(raw); ok && ui != "" {
		// Quoted fragments of the message (an invalid escape such as
		// "%zz") may come from the password.
		parts := strings.Split(msg, `"`)
		for i := 1; i < len(parts); i += 2 {
			if strings.Contains(ui, parts[i]) {
				parts[i] = "xxxxx"
			}
		}
		msg = strings.Join(parts, `"`)
	}
	return msg
}

// CheckURL returns nil if raw parses as a URL, else an error for flag
// ("--redis-url") that shows raw redacted: url.Parse's own error quotes
// the whole URL, password included.
func CheckURL(flag, raw string) error {
	if p := URLProblem(raw); p != "" {
		return fmt.Errorf("%s %s: not a valid URL: %s", flag, RedactURL(raw), p)
	}
	return nil
}

// splitUserInfo splits raw around its user info: the text between "://"
// and the last "@" of the authority. It works on URLs that do not parse.
func splitUserInfo(raw string) (head, ui, tail string, ok bool) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return "", "", "", false
	}
	head, rest := raw[:i+3], raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return "", "", "", false
	}
	return head, rest[:at], rest[at:], true
}
