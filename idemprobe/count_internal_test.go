package idemprobe

import "testing"

func TestParseCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want int64
		ok   bool
	}{
		{`[1,2,3]`, 3, true},
		{`{"data":[{"id":"a"},{"id":"b"}],"has_more":false}`, 2, true},
		{`42`, 42, true},
		{` 7 `, 7, true},
		{`{"count":3}`, 0, false},
		{`1.5`, 0, false},
		{`not json`, 0, false},
	} {
		got, err := parseCount([]byte(tc.body))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseCount(%s) = %d, %v; want %d, ok %v", tc.body, got, err, tc.want, tc.ok)
		}
	}
}

func TestAnswerID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, location, want string }{
		{`{"id":"pay_1"}`, "/x/2", "pay_1"},
		{`{"id":1000000}`, "", "1000000"},
		{`{"id":""}`, "/x/2", "/x/2"},
		{`{"data":{"id":"nested"}}`, "", ""},
		{`[{"id":"in a list"}]`, "/x/3", "/x/3"},
	} {
		if got := answerID([]byte(tc.body), tc.location); got != tc.want {
			t.Errorf("answerID(%s, %q) = %q, want %q", tc.body, tc.location, got, tc.want)
		}
	}
}
