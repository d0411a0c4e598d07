output "cluster_name" {
  description = "EKS cluster name (for `aws eks update-kubeconfig`)."
  value       = module.eks.cluster_name
}

output "region" {
  description = "AWS region of every resource."
  value       = var.region
}

output "ecr_repository_url" {
  description = "Push the arl image here; settings image.repository."
  value       = aws_ecr_repository.arl.repository_url
}

output "dvc_bucket" {
  description = "S3 bucket of the DVC remote (s3://<name>/dvc)."
  value       = aws_s3_bucket.this["dvc"].id
}

output "mlflow_bucket" {
  description = "S3 bucket of MLflow artifacts."
  value       = aws_s3_bucket.this["mlflow"].id
}

output "db_address" {
  description = "PostgreSQL host name (Helm values of Prefect server and MLflow)."
  value       = aws_db_instance.postgres.address
}

output "db_port" {
  description = "PostgreSQL port."
  value       = aws_db_instance.postgres.port
}

output "db_master_secret_arn" {
  description = "Secrets Manager secret holding the PostgreSQL master user and password (read once by the db-init step)."
  value       = aws_db_instance.postgres.master_user_secret[0].secret_arn
}

output "flow_runner_role_arn" {
  description = "IAM role bound (Pod Identity) to the flow-runner service account."
  value       = aws_iam_role.pod["flow_runner"].arn
}

output "mlflow_role_arn" {
  description = "IAM role bound (Pod Identity) to the MLflow service account."
  value       = aws_iam_role.pod["mlflow"].arn
}
