// Command cainjector runs cert-manager's CA injector for node-holder's tests:
// it copies the CA of the Certificate named by a webhook configuration's
// `cert-manager.io/inject-ca-from` annotation into the configuration's
// caBundle.
//
// cert-manager's own main (github.com/cert-manager/cert-manager/cmd/cainjector)
// is a separate Go module that the module proxy does not serve, so this sets
// up the root module's injector (pkg/controller/cainjector) in a
// controller-runtime manager as that main does, for the
// MutatingWebhookConfiguration kind only, without leader election, metrics or
// health endpoints.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cmapi "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	"github.com/cert-manager/cert-manager/pkg/util"
)

func main() {
	// controller-runtime registers --kubeconfig itself (it panics on a
	// second definition): read that one.
	klog.InitFlags(nil)
	flag.Parse()
	kubeconfig := flag.Lookup("kubeconfig").Value.String()
	if kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "cainjector: --kubeconfig is required")
		os.Exit(2)
	}
	ctrl.SetLogger(klog.Background())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, kubeconfig); err != nil {
		klog.ErrorS(err, "cainjector failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig string) error {
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	// The injector names its server-side apply field manager after the user
	// agent: without one the API server refuses every apply.
	config = util.RestConfigWithUserAgent(config, "cainjector")
	scheme := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(admissionregistrationv1.AddToScheme(scheme))
	utilruntime.Must(cmapi.AddToScheme(scheme))

	manager, err := ctrl.NewManager(config, ctrl.Options{
		Scheme:                 scheme,
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Client: client.Options{
			Cache: &client.CacheOptions{
				// The injector watches Secrets' metadata only and reads the
				// one Secret it injects from directly, as cert-manager's
				// own cainjector does.
				DisableFor: []client.Object{&corev1.Secret{}},
			},
		},
	})
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}
	if err := cainjector.RegisterAllInjectors(ctx, manager, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName: true,
		},
	}); err != nil {
		return fmt.Errorf("registering the injectors: %w", err)
	}
	klog.InfoS("cainjector started")
	return manager.Start(ctx)
}
